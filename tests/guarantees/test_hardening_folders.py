"""Fault and abuse cases (issue 13), part 2: resume, damaged and read-only run folders, exit codes
(a crash is 2, never 1), gsm8k --run-dir. Each case runs the real CLI and asserts the exit code, the
one-line message, and that nothing already written changed (file digests)."""

from __future__ import annotations

import errno
import json
import os

import pytest

from e2e.cli import main
from e2e.design.config import parse_config
from e2e.rundir import manifest as mf
from e2e.rundir.store import CELLS, MANIFEST, PLAN, write_json_atomic
from tests.support.hardening import (  # noqa: F401
    ROOT,
    base_cfg,
    digest,
    finished_run,
    one_line,
    read_only,
    run_cli,
    run_copy,
    standin,
    write_cfg,
)


# -- resume ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "flags",
    [
        ["--config", "x.toml"],
        ["--depths", "16"],
        ["--reps", "2"],
        ["--tp", "2"],
        ["--arms", "a"],
        ["--order", "both"],
        ["--passes", "2"],
        ["--model", "m2"],
        ["--server-mode", "per-arm-pass"],
        ["--target-ci", "5"],
        ["--out", "x"],
        ["--run-id", "x"],
        ["--retries", "0"],
        ["--fail-fast"],
        ["--dry-run"],
    ],
)
def test_resume_refuses_flags_that_would_change_the_run(run_copy, capsys, flags):
    before = digest(run_copy)
    rc, err = run_cli(capsys, "--resume", run_copy, *flags)
    assert rc == 2 and err.startswith(f"error: --resume: {flags[0]} cannot change a run")
    assert digest(run_copy) == before


def test_resume_records_the_commit_that_ran_it(run_copy, capsys):
    m = json.loads((run_copy / MANIFEST).read_text())
    m["git"] = {"commit": "0" * 40, "dirty": False}  # as if started by another checkout
    write_json_atomic(run_copy / MANIFEST, m)
    rows = {f: digest(run_copy)[f] for f in (CELLS, PLAN)}
    assert main(["--resume", str(run_copy), "--no-progress"]) == 1  # nothing left to run; failed cells
    after = json.loads((run_copy / MANIFEST).read_text())
    assert after["git"]["commit"] == "0" * 40
    assert after["resumes"][-1]["git"] == mf.git_commit(mf.project_root()) != after["git"]
    assert {f: digest(run_copy)[f] for f in (CELLS, PLAN)} == rows


# -- damaged run folders -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "line, msg",
    [
        (b"{}", "row 3 has schema_version None"),
        (b"[]", "row 3 is list, not an object"),
        (b'"s"', "row 3 is str, not an object"),
        (b"null", "row 3 is NoneType, not an object"),
        (b"no json", "line 3 is not JSON"),
        (b"\xff\xfe{}", "line 3 is not JSON"),
        (b"\x80abc", "line 3 is not JSON"),  # not UTF-8: was a UnicodeDecodeError traceback
        (b"[" * 100_000, "line 3 is not JSON"),  # nested past the parser: was a RecursionError
        (b"missing-attempt", "row 3: attempt: Field required"),
    ],
)
@pytest.mark.parametrize("command", ["report", "resume"])
def test_damaged_cell_rows_are_one_line_and_change_nothing(run_copy, capsys, line, msg, command):
    if line == b"missing-attempt":
        row = json.loads((run_copy / CELLS).read_text().splitlines()[0])
        del row["attempt"]
        line = json.dumps(row).encode()
    with open(run_copy / CELLS, "ab") as f:
        f.write(line + b"\n")
    before = digest(run_copy)
    rc, err = run_cli(capsys, *(["report", run_copy] if command == "report" else ["--resume", run_copy]))
    assert rc == 2 and f"{run_copy / CELLS}: {msg}" in err
    assert digest(run_copy) == before


@pytest.mark.parametrize(
    "name, content, msg",
    [
        (MANIFEST, b"{not json", "manifest.json: not JSON"),
        (MANIFEST, b"[1, 2]", "manifest.json: not a JSON object"),
        (MANIFEST, b"[" * 100_000, "manifest.json: not JSON (maximum recursion depth"),
        (MANIFEST, b'{"schema_version": 1}', "manifest.json: has no config table"),
        (PLAN, b'{"cells": []}', "plan.json: not a JSON list of cells"),
        (PLAN, b"[1]", "plan.json: entry 1 is int, not an object"),
        (PLAN, b'[{"index": 0}]', "plan.json: entry 1: cell_id: Field required"),
    ],
)
def test_a_damaged_manifest_or_plan_is_one_line(run_copy, capsys, name, content, msg):
    (run_copy / name).write_bytes(content)
    before = digest(run_copy)
    rc, err = run_cli(capsys, "--resume", run_copy)
    assert rc == 2 and msg in err
    if "config table" not in msg:  # report reads no config
        rc, err = run_cli(capsys, "report", run_copy)
        assert rc == 2 and msg in err
    assert digest(run_copy) == before


def test_a_plan_that_names_a_cell_twice_is_one_line(run_copy, capsys):
    plan = json.loads((run_copy / PLAN).read_text())
    (run_copy / PLAN).write_text(json.dumps(plan + plan[:1]))
    rc, err = run_cli(capsys, "report", run_copy)
    assert rc == 2 and "is planned twice" in err


# -- read-only folders -------------------------------------------------------------------------------
def test_report_on_a_read_only_run_folder(run_copy, capsys):
    before = digest(run_copy)
    with read_only(run_copy):
        rc, err = run_cli(capsys, "report", run_copy)
    assert rc == 2 and f"report: {run_copy} is not writable" in err
    assert digest(run_copy) == before


def test_resume_on_a_read_only_run_folder(run_copy, capsys):
    before = digest(run_copy)
    with read_only(run_copy):
        rc, err = run_cli(capsys, "--resume", run_copy)
    assert rc == 2 and f"results folder {run_copy} is not writable" in err
    assert digest(run_copy) == before


def test_compare_json_into_a_read_only_folder(finished_run, tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    with read_only(ro):
        rc, err = run_cli(capsys, "compare", finished_run, finished_run, "--json", ro / "c.json")
    assert rc == 2 and f"--json {ro / 'c.json'}: {ro} is not writable" in err
    assert list(ro.iterdir()) == []


# -- exit codes: a crash is 2, never 1 ---------------------------------------------------------------
def test_an_internal_error_is_exit_2_with_a_traceback_and_one_line_last(tmp_path, standin, capsys, monkeypatch):
    import e2e.design.plan

    def boom(cfg):
        raise RuntimeError("planted bug")

    monkeypatch.setattr(e2e.design.plan, "make_plan", boom)
    assert main(["--config", str(write_cfg(tmp_path / "c.toml", base_cfg(standin))), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == "Traceback (most recent call last):"
    assert err[-1] == "error: internal error: RuntimeError: planted bug (traceback above; please report it)"


def test_a_crash_in_compare_is_not_a_regression(finished_run, capsys, monkeypatch):
    import e2e.report.compare

    monkeypatch.setattr(e2e.report.compare, "compare_runs", lambda *a, **k: 1 / 0)
    assert main(["compare", str(finished_run), str(finished_run)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: internal error: ZeroDivisionError")


def test_a_crash_mid_run_leaves_the_manifest_saying_so(tmp_path, standin, capsys, monkeypatch):
    from e2e.run import runner

    monkeypatch.setattr(runner.Runner, "run", lambda self: {}["planted"])
    cfg = write_cfg(tmp_path / "c.toml", base_cfg(standin))
    assert main(["--config", str(cfg), "--out", str(tmp_path), "--run-id", "r", "--no-progress"]) == 2
    m = json.loads((tmp_path / "r" / MANIFEST).read_text())
    assert m["status"] == "stopped-on-error" and m["error"] == "KeyError: 'planted'" and m["ended"]
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: internal error: KeyError")


@pytest.mark.parametrize("err, msg", [(errno.EACCES, "Permission denied"), (errno.ENOSPC, "No space left")])
def test_an_environment_oserror_is_one_line(tmp_path, standin, capsys, monkeypatch, err, msg):
    import e2e.design.plan

    def denied(cfg):
        raise OSError(err, os.strerror(err), "/some/file")

    monkeypatch.setattr(e2e.design.plan, "make_plan", denied)
    rc, line = run_cli(capsys, "--config", write_cfg(tmp_path / "c.toml", base_cfg(standin)), "--dry-run")
    assert rc == 2 and line == f"error: /some/file: {os.strerror(err)}" and msg in line


# -- gsm8k --run-dir: the run's own config; an edited arm is not reused ------------------------------------
def _gsm8k(monkeypatch, *argv) -> tuple[int, list]:
    """`run_e2e.py gsm8k ...` through the CLI, with the evaluation itself replaced (it is tested in
    test_gsm8k_server.py): what matters here is the config and arms it is given."""
    from e2e.accuracy import gsm8k_step

    seen = []
    monkeypatch.setattr(
        gsm8k_step, "run_gsm8k", lambda cfg, root, names, *a, **k: seen.append((cfg, names)) or {"verdict": "pass"}
    )
    return main(["gsm8k", *map(str, argv)]), seen


def test_gsm8k_run_dir_uses_the_runs_own_config(run_copy, tmp_path, standin, monkeypatch, capsys):
    rc, seen = _gsm8k(monkeypatch, "--run-dir", run_copy)  # no --config: not the gemma default
    assert rc == 0 and [n for _, n in seen] == [["a", "b"]] and seen[0][0].server.python == str(standin)
    capsys.readouterr()
    other = base_cfg(standin)
    other["arms"][1]["name"] = "x"
    before = digest(run_copy)
    rc, _ = _gsm8k(monkeypatch, "--run-dir", run_copy, "--config", write_cfg(tmp_path / "o.toml", other))
    err = one_line(capsys)
    assert rc == 2 and f"differs from the config {run_copy} recorded (at arms.1.name); drop --config" in err
    assert digest(run_copy) == before
    rc, _ = _gsm8k(monkeypatch, "--run-dir", run_copy, "--config", write_cfg(tmp_path / "same.toml", base_cfg(standin)))
    assert rc == 0  # the same config given explicitly is accepted


def test_a_units_reuse_check_names_its_arms_server_without_secrets():
    from e2e.accuracy.unit import unit_settings

    def settings(**arm):
        cfg = parse_config({"model": {"path": "m"}, "workload": {"depths": [16]}, "arms": [{"name": "a", **arm}]})
        return unit_settings(cfg, ["t"], 1, "sha", "a")

    plain = settings(env={"HF_TOKEN": "tok-one-1234", "X": "1"})
    assert settings(env={"HF_TOKEN": "tok-two-5678", "X": "1"}) == plain  # a new token changes no result
    assert "tok-one-1234" not in json.dumps(plain)
    for edit in (
        {"env": {"HF_TOKEN": "tok-one-1234", "X": "2"}},
        {"args": ["--dtype", "half"]},
        {"patches": ["widened-gfx11-gate"]},
        {"python": "/other/python"},
    ):
        assert settings(**{"env": {"HF_TOKEN": "tok-one-1234", "X": "1"}, **edit}) != plain, edit


def test_an_edited_arm_is_run_again_and_the_other_reused(tmp_path, monkeypatch):
    from e2e.accuracy import gsm8k_step, unit
    from e2e.assets import PINS

    task = "gsm8k_zeroshot_offline"
    data = {
        "model": {"path": "m"},
        "workload": {"depths": [16]},
        "gsm8k": {"tasks": [task], "limit": 2},
        "arms": [{"name": "a"}, {"name": "b", "args": ["--dtype", "half"]}],
    }
    old = parse_config(data)
    for arm in ("a", "b"):
        d = tmp_path / "gsm8k" / arm / "r1"
        d.mkdir(parents=True)
        (d / f"questions-{task}.jsonl").write_text(
            "".join(
                json.dumps({"doc_id": i, "response": "r", "filters": {"flexible-extract": {"correct": True}}}) + "\n"
                for i in range(2)
            )
        )
        (d / "unit.json").write_text(
            json.dumps(
                {
                    "schema_version": unit.SCHEMA_VERSION,
                    "status": "ok",
                    "server": {},
                    "settings": unit.unit_settings(old, [task], 2, PINS["gsm8k"]["sha256"], arm),
                    "tasks": {
                        task: {
                            "n": 2,
                            "questions": f"questions-{task}.jsonl",
                            "correct": {"flexible-extract": 2},
                            "accuracy": {"flexible-extract": 1.0},
                        }
                    },
                }
            )
        )
    ran = []
    monkeypatch.setattr(gsm8k_step, "run_unit", lambda cfg, u, *a, **k: ran.append(u.arm) or {"status": "failed"})
    data["arms"][1]["args"] = ["--dtype", "float32"]  # b edited after its sign-off
    gsm8k_step.run_gsm8k(parse_config(data), tmp_path, ["a", "b"], None, assets_root=ROOT / "assets")
    assert ran == ["b"]
