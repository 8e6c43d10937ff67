"""Config validation: every bad field gets a one-line error naming it; overrides apply."""

from __future__ import annotations

import copy

import pytest

from e2e.cli import main
from e2e.design.config import load_config, order_arms, parse_config
from e2e.errors import UserError

BASE = {
    "model": {"path": "m", "max_model_len": 4096},
    "workload": {"depths": [256, 1024]},
    "arms": [{"name": "stock"}, {"name": "widened", "patches": ["widened-gfx11-gate"]}],
}


def bad(mutate) -> str:
    d = copy.deepcopy(BASE)
    mutate(d)
    with pytest.raises(UserError) as e:
        parse_config(d)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_valid_base_parses_and_sorts_depths():
    d = copy.deepcopy(BASE)
    d["workload"]["depths"] = [1024, 256]
    cfg = parse_config(d)
    assert cfg.workload.depths == (256, 1024)
    assert cfg.arm("widened").patches == ("widened-gfx11-gate",)


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda d: d.update(colour="red"), "colour: unknown key"),
        (lambda d: d["workload"].update(depths=[-5]), "workload.depths"),
        (lambda d: d["workload"].update(depths=[4090]), "exceeds the model context"),
        (lambda d: d["arms"].append({"patches": []}), "arms.2.name: required field missing"),
        (lambda d: d["arms"].append({"name": "x", "patches": ["nonsense"]}), "unknown patch 'nonsense'"),
        (lambda d: d.setdefault("run", {}).update(order="fast-first"), "run.order 'fast-first' names no arm"),
        (lambda d: d["arms"].append({"name": "stock"}), "name 'stock' is used twice"),
        (lambda d: d["workload"].update(long_tokens=8, short_tokens=8), "long_tokens (8) must exceed"),
        (
            lambda d: (
                d["server"].update(tensor_parallel_size=0)
                if "server" in d
                else d.update(server={"tensor_parallel_size": 0})
            ),
            "server.tensor_parallel_size",
        ),
    ],
)
def test_bad_fields_are_named(mutate, field):
    assert field in bad(mutate)


def test_order_names_refer_to_first_and_second_arm():
    assert order_arms("stock-first", ["a", "b"]) == ["a", "b"]
    assert order_arms("widened-first", ["a", "b"]) == ["b", "a"]
    assert order_arms("b-first", ["a", "b", "c"]) == ["b", "a", "c"]
    assert order_arms("both", ["a", "b"]) == ["a", "b"]
    with pytest.raises(ValueError):
        order_arms("widened-first", ["only"])


def test_file_overrides_and_cli_errors(tmp_path, capsys, in_root):
    cfg = load_config("configs/cpu-demo.toml", {"run.order": "widened-first", "workload.depths": [512]})
    assert cfg.run.order == "widened-first" and cfg.workload.depths == (512,)
    assert main(["--config", "configs/cpu-demo.toml", "--arms", "nope", "--dry-run"]) == 2
    assert "--arms: no arm named 'nope'" in capsys.readouterr().err
    assert main(["--config", str(tmp_path / "missing.toml"), "--dry-run"]) == 2
    assert "config file not found" in capsys.readouterr().err
    (tmp_path / "broken.toml").write_text("name = [")
    assert main(["--config", str(tmp_path / "broken.toml"), "--dry-run"]) == 2
    assert "not valid TOML" in capsys.readouterr().err


def test_default_config_is_the_reference_experiment(in_root):
    cfg = load_config("configs/gemma3-27b-it-w4a16-tp2.toml")
    assert cfg.server.tensor_parallel_size == 2 and cfg.server.cuda_graphs
    assert cfg.workload.depths == (1024, 8192, 32768)
    assert (cfg.workload.long_tokens, cfg.workload.short_tokens) == (64, 8)
    assert [a.name for a in cfg.arms] == ["stock", "widened"]
