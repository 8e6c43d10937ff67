"""Issue 22, gap 6: odd values are refused before anything starts, one line, exit 2.

- A manifest field of the wrong type (model, gpu, arms, config.stats.alpha, ...) is one line in
  report, compare and --resume (which then writes nothing), and history skips that run naming it.
- Config and flag values that used to pass validation and --dry-run and crash once the run folder
  existed: env names with '=', NUL bytes, absurd depths, NaN/inf numbers, --cpus-per-cell nan.
- Statistics bounds: min_effect_pct in (0, 50], alpha in (0, 0.5), in a config and in a manifest.
- A manifest whose config was edited after the run started is refused by --resume (content hash).
The runs are made by the real harness with the stand-in server of tests/support/hardening.py (its
cells fail at once: these are input faults, no server behaviour is under test).
"""

from __future__ import annotations

import json
import shutil

import pytest

from e2e.cli import main
from e2e.rundir.store import MANIFEST, write_json_atomic
from tests.support.hardening import base_cfg, digest, finished_run, one_line, run_cli, run_copy, standin, write_cfg  # noqa: F401


def _edit(run, path, value):
    m = json.loads((run / MANIFEST).read_text())
    node = m
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    write_json_atomic(run / MANIFEST, m)


# -- the manifest read through a typed model ----------------------------------------------------------
WRONG_TYPES = [
    (("model",), "x", "model"),
    (("model",), {"path": 5}, "model.path"),
    (("gpu",), "H200", "gpu"),
    (("gpu",), {"nvidia_smi": [{"name": 1}]}, "gpu.nvidia_smi.0.name"),
    (("arms",), ["a"], "arms"),
    (("arms", "a", "installation"), "x", "arms.a.installation"),
    (("config", "stats", "alpha"), "0.05", "config.stats.alpha"),
    (("config", "stats", "alpha"), None, "config.stats.alpha"),
    (("config", "stats", "min_effect_pct"), [2], "config.stats.min_effect_pct"),
    (("config", "server", "tensor_parallel_size"), "1", "config.server.tensor_parallel_size"),
    (("config", "server", "cuda_graphs"), "no", "config.server.cuda_graphs"),
    (("config", "workload", "long_tokens"), 6.5, "config.workload.long_tokens"),
    (("config", "arms"), {"name": "a"}, "config.arms"),
    (("started",), 5, "started"),
    (("executors",), {"kind": "local"}, "executors"),
]


@pytest.mark.parametrize("path, value, field", WRONG_TYPES)
@pytest.mark.parametrize("command", ["report", "resume", "compare"])
def test_a_wrong_type_in_the_manifest_is_one_line_and_changes_nothing(run_copy, capsys, path, value, field, command):
    _edit(run_copy, path, value)
    before = digest(run_copy)
    argv = {
        "report": ["report", run_copy],
        "resume": ["--resume", run_copy, "--no-progress"],
        "compare": ["compare", run_copy, run_copy],
    }[command]
    rc, err = run_cli(capsys, *argv)
    assert rc == 2 and f"{run_copy}/manifest.json: {field}: " in err, err
    assert digest(run_copy) == before


@pytest.mark.parametrize("path, value, field", [WRONG_TYPES[i] for i in (0, 2, 4, 6)])  # the fields history hit
def test_history_skips_a_run_with_a_wrong_type_and_names_it(finished_run, tmp_path, capsys, path, value, field):
    folder = tmp_path / "runs"
    for name in ("good1", "bad", "good2"):
        shutil.copytree(finished_run, folder / name)
    _edit(folder / "bad", path, value)
    _edit(folder / "good2", ("run_id",), "good2")  # another run, not a copy of good1 (counted once)
    rc = main(["history", str(folder)])
    out = capsys.readouterr()
    assert "internal error" not in out.err and "Traceback" not in out.err
    text = " ".join(out.out.split())  # rich wraps long lines
    assert f"warning: skipped bad: {folder / 'bad'}/manifest.json: {field}:" in text
    # the two good runs are one series; their cells all failed, so it cannot decide (never a blind 0)
    j = json.loads((folder / "history.json").read_text())
    assert rc == 3 and {r["run"] for r in j["runs"]} == {"good1", "good2"}
    assert j["skipped"][0].startswith("skipped bad:")


# -- config and flag values that crashed after the run folder existed -----------------------------------
def _set(d, dotted, value):
    *parents, leaf = dotted.split(".")
    for p in parents:
        d = d[int(p)] if isinstance(d, list) else d.setdefault(p, {})
    d[leaf] = value


BAD_CONFIGS = [
    ("server.env", {"A=B": "1"}, "server.env: variable name 'A=B' holds '='"),
    ("arms.1.env", {"": "1"}, "arms.1.env: variable name '' is empty"),
    ("arms.0.env", {"X": "a\x00b"}, "arms.0.env.X: holds a NUL byte"),
    ("server.env", {"X\x00": "1"}, "server.env: key 'X\\x00' holds a NUL byte"),
    ("server.extra_args", ["--dtype", "half\x00"], "server.extra_args.1: holds a NUL byte"),
    ("model.path", "m\x00", "model.path: holds a NUL byte"),
    ("workload.depths", [2**63 - 1], "workload.depths.0: Input should be less than or equal to"),
    ("workload.depths", [2**31], "workload.depths.0: Input should be less than or equal to"),
    ("workload.long_tokens", 2**40, "workload.long_tokens: Input should be less than or equal to"),
    ("workload.seed", -1, "workload.seed: Input should be greater than or equal to 0"),
    ("model.vocab_size", 2**62, "model.vocab_size: Input should be less than or equal to"),
    ("run.passes", 10**9, "run.passes: Input should be less than or equal to"),
    ("workload.target_ci_pct", float("nan"), "workload.target_ci_pct: Input should be a finite number"),
    ("server.startup_timeout_s", float("inf"), "server.startup_timeout_s: Input should be a finite number"),
    ("stats.min_effect_pct", 1e9, "stats.min_effect_pct: Input should be less than or equal to 50"),
    ("stats.min_effect_pct", 0, "stats.min_effect_pct: Input should be greater than 0"),
    ("stats.alpha", 0.5, "stats.alpha: Input should be less than 0.5"),
    ("stats.alpha", 0.7, "stats.alpha: Input should be less than 0.5"),
    ("gsm8k.alpha", 0.7, "gsm8k.alpha: Input should be less than 0.5"),
    ("gsm8k.max_accuracy_drop", 5, "gsm8k.max_accuracy_drop: Input should be less than 1"),
]


@pytest.mark.parametrize("dotted, value, msg", BAD_CONFIGS)
def test_bad_config_values_are_refused_by_dry_run_and_before_a_run_folder(
    tmp_path, standin, capsys, dotted, value, msg
):
    data = base_cfg(standin)
    _set(data, dotted, value)
    cfg = write_cfg(tmp_path / "c.toml", data)
    rc, err = run_cli(capsys, "--config", cfg, "--dry-run")
    assert rc == 2 and msg in err, err
    rc, err = run_cli(capsys, "--config", cfg, "--out", tmp_path / "o", "--run-id", "r", "--no-progress")
    assert rc == 2 and msg in err and not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "flags, msg",
    [
        (["--executor", "ray", "--cpus-per-cell", "nan"], "--cpus-per-cell 'nan': give a positive finite number"),
        (["--executor", "ray", "--cpus-per-cell", "0"], "--cpus-per-cell '0': give a positive finite number"),
        (["--executor", "ray", "--cpus-per-cell", "inf"], "--cpus-per-cell 'inf': give a positive finite number"),
        (["--executor", "ray", "--max-per-host", "0"], "--max-per-host '0': give a positive whole number"),
        (["--executor", "ray", "--max-slots", "-1"], "--max-slots '-1': give a positive whole number"),
        (["--limit", "-3"], "--limit '-3': give a whole number, 0 or more"),
        (["--target-ci", "nan"], "--target-ci 'nan': give a positive finite number"),
        (["--max-minutes", "inf"], "--max-minutes 'inf': give a positive finite number"),
        (["--gsm8k-aa", "nope"], "--gsm8k-aa: no arm named 'nope'"),
    ],
)
def test_bad_flag_values_are_refused_by_dry_run_and_before_a_run_folder(tmp_path, standin, capsys, flags, msg):
    cfg = write_cfg(tmp_path / "c.toml", base_cfg(standin))
    rc, err = run_cli(capsys, "--config", cfg, "--dry-run", *flags)
    assert rc == 2 and msg in err, err
    rc, err = run_cli(capsys, "--config", cfg, "--out", tmp_path / "o", "--run-id", "r", *flags)
    assert rc == 2 and msg in err and not (tmp_path / "o").exists()


def test_a_manifest_with_out_of_bounds_statistics_is_refused_by_compare(run_copy, finished_run, capsys):
    """An edited min_effect_pct of 1e9 made every difference 'equivalent' and compare exit 0."""
    _edit(run_copy, ("config", "stats", "min_effect_pct"), 1e9)
    rc, err = run_cli(capsys, "compare", run_copy, finished_run)
    assert rc == 2 and "config.stats.min_effect_pct: Input should be less than or equal to 50" in err
    _edit(run_copy, ("config", "stats", "min_effect_pct"), 2.0)
    _edit(run_copy, ("config", "stats", "alpha"), 0.9)
    rc, err = run_cli(capsys, "compare", finished_run, run_copy)
    assert rc == 2 and "config.stats.alpha: Input should be less than 0.5" in err


# -- a manifest edited before --resume ------------------------------------------------------------------
@pytest.mark.parametrize(
    "path, value",
    [
        (("config", "workload", "rounds"), 7),
        (("config", "arms", 1, "args"), ["--dtype", "half"]),
        (("config", "server", "env"), {"VLLM_X": "1"}),
    ],
)
def test_resume_refuses_a_manifest_whose_config_was_edited(run_copy, capsys, path, value):
    assert len(json.loads((run_copy / MANIFEST).read_text())["config_sha256"]) == 64
    _edit(run_copy, path, value)
    before = digest(run_copy)
    rc, err = run_cli(capsys, "--resume", run_copy, "--no-progress")
    assert rc == 2 and "config no longer matches the hash recorded when the run started" in err
    assert digest(run_copy) == before


def test_resume_of_an_unedited_manifest_and_of_one_from_before_the_hash(run_copy, capsys):
    assert main(["--resume", str(run_copy), "--no-progress"]) == 1  # every cell already recorded (failed)
    m = json.loads((run_copy / MANIFEST).read_text())
    del m["config_sha256"]  # a run started before the hash was recorded
    write_json_atomic(run_copy / MANIFEST, m)
    assert main(["--resume", str(run_copy), "--no-progress"]) == 1
    capsys.readouterr()
