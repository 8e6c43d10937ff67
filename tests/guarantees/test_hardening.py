"""Fault and abuse cases (issue 13), part 1: secrets, harness-owned flags, the plugin shim, where a
run folder goes, which interpreter runs, config shapes. Each case runs the real CLI and asserts the
exit code, the one-line message, and that nothing already written changed (file digests).
Part 2 (tests/guarantees/test_hardening_folders.py): resume, damaged and read-only run folders, exit codes,
gsm8k --run-dir. Part 3 (tests/guarantees/test_hardening_fuzz.py): the run-folder readers fuzzed, a clean install.
The stand-in server is described in tests/support/hardening.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from e2e.cli import main
from e2e.design.config import load_config
from e2e.rundir.store import CELLS, MANIFEST, RunStore
from e2e.safety.redact import REDACTED, is_secret_name, redact_args, redact_env, secret_values
from e2e.serve import launch
from tests.support.hardening import base_cfg, digest, finished_run, new_run, run_cli, standin, write_cfg  # noqa: F401


# -- secrets ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "MY_API_KEY",
        "DB_PASS",
        "DB_PASSWORD",
        "X_PASSWD",
        "X_PWD",
        "GH_PAT",
        "PAT_X",
        "--gh-pat",
        "SESSION_COOKIE",
        "AWS_SECRET_ACCESS_KEY",
        "SERVICE_CREDENTIALS",
        "BASIC_AUTH",
        "--hf-token",
        "--api_key",
    ],
)
def test_secret_names_are_recognised(name):
    assert is_secret_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "PATH",
        "PYTHONPATH",
        "TOKENIZERS_PARALLELISM",
        "--max-num-batched-tokens",
        "--tokenizer",
        "COMPAT_MODE",
        "VLLM_CPU_KVCACHE_SPACE",
        "--dtype",
    ],
)
def test_ordinary_names_are_not_secrets(name):
    assert not is_secret_name(name)


def test_redaction_hides_values_by_name():
    assert redact_env({"DB_PASS": "p", "VLLM_X": "1"}) == {"DB_PASS": REDACTED, "VLLM_X": "1"}
    assert redact_args(["--gh-pat", "x", "--db-password=y", "--max-num-batched-tokens", "2048"]) == [
        "--gh-pat",
        REDACTED,
        f"--db-password={REDACTED}",
        "--max-num-batched-tokens",
        "2048",
    ]


def test_values_scrubbed_are_the_secret_ones():
    got = secret_values(
        {"DB_PASS": "pw-123456", "X_KEY": "auto", "PWD": "/work/here", "VLLM_X": "value-1"},
        ["--hf-token", "tok-abcdef", "--dtype", "float32", "--auth=cookie-99"],
        ["the-api-key"],
    )
    # too short to scrub by value (still redacted by name); PWD is a folder, not a secret
    assert got == {"pw-123456", "tok-abcdef", "cookie-99", "the-api-key"}


SECRETS = {f"S{i}": f"s3cr3t-{i:02d}-{'x' * 6}" for i in range(1, 12)}


def secret_cfg(standin: Path) -> dict:
    """A secret in every place a user can put one (S11 is in the harness's own environment)."""
    s = SECRETS
    data = base_cfg(standin)
    data["server"].update(
        env={"HF_TOKEN": s["S1"], "DB_PASS": s["S2"]},
        extra_args=["--hf-token", s["S3"]],
        allow_harness_flag_overrides=True,
    )
    data["arms"] = [
        {
            "name": "a",
            "env": {"MY_API_KEY": s["S4"], "GH_PAT": s["S5"], "X_PWD": s["S6"], "SESSION_COOKIE": s["S7"]},
            "args": [f"--db-password={s['S8']}", "--api-key", s["S9"]],
        },
        {"name": "b", "args": [f"--auth-token={s['S10']}"]},
    ]
    return data


def assert_no_secret(folder: Path) -> int:
    """No secret value (nor the session's API key) in any file under folder; returns files read."""
    needles = {**SECRETS, "api_key": launch.session_api_key()}
    files = [p for p in folder.rglob("*") if p.is_file()]
    for p in files:
        data = p.read_bytes()
        for name, value in needles.items():
            assert value.encode() not in data, f"{name} leaked into {p}"
    return len(files)


def test_every_planted_secret_is_absent_from_the_whole_run_folder(tmp_path, standin, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", SECRETS["S11"])
    cfg = write_cfg(tmp_path / "c.toml", secret_cfg(standin))
    assert main(["--config", str(cfg), "--out", str(tmp_path), "--run-id", "r", "--no-progress"]) == 1
    run = tmp_path / "r"
    assert assert_no_secret(run) >= 8  # manifest, plan, cells, logs, report files
    # Not vacuous: the stand-in printed every secret-named variable and flag, now scrubbed in place.
    log = (run / "logs" / "p1-d16-a.a0.log").read_text().splitlines()
    assert log[0].startswith("# argv: ") and f"--db-password={REDACTED}" in log[0]
    printed_env = json.loads(next(x for x in log if x.startswith("env: "))[5:])
    for k in (
        "HF_TOKEN",
        "DB_PASS",
        "MY_API_KEY",
        "GH_PAT",
        "X_PWD",
        "SESSION_COOKIE",
        "WANDB_API_KEY",
        "VLLM_API_KEY",
    ):
        assert printed_env[k] == REDACTED, k
    printed_argv = json.loads(next(x for x in log if x.startswith("argv: "))[6:])
    assert [REDACTED, f"--db-password={REDACTED}", "--api-key", REDACTED] == printed_argv[-4:]
    cells = RunStore(run).cells()
    assert all("env: " in c["log_tail"] for c in cells)  # the tail carried the printout, scrubbed
    m = json.loads((run / MANIFEST).read_text())
    assert m["config"]["server"]["env"] == {"HF_TOKEN": REDACTED, "DB_PASS": REDACTED}
    assert m["config"]["arms"][0]["args"] == [f"--db-password={REDACTED}", "--api-key", REDACTED]
    # The escape hatch is recorded in the manifest and stated at the top of the report.
    assert m["harness_flag_overrides"] == ["arms.a.args: --api-key (sets --api-key)"]
    assert "| harness flag overrides | **allowed**" in (run / "report.md").read_text()


def test_a_gsm8k_unit_whose_server_fails_keeps_no_secret(tmp_path, standin, monkeypatch):
    from e2e.accuracy.unit import Unit, run_unit

    monkeypatch.setenv("WANDB_API_KEY", SECRETS["S11"])
    cfg = load_config(write_cfg(tmp_path / "c.toml", secret_cfg(standin)))
    rec = run_unit(
        cfg, Unit("a"), tmp_path / "u", tmp_path, ["gsm8k_cot_offline"], 1, {}, lambda m: None, run_root=tmp_path
    )
    assert rec["status"] == "failed" and "env: " in rec["log_tail"]
    assert assert_no_secret(tmp_path / "u") >= 2  # unit.json and the server log


def test_the_argv_line_is_redacted_at_once_and_the_log_scrubbed_when_the_server_stops(tmp_path):
    from e2e.serve.server import ServerSpec, VllmServer

    script = tmp_path / "sleeper"
    script.write_text(
        f"#!{sys.executable}\nimport os, sys, time\nprint(os.environ['DB_PASS'], sys.argv[-1], "
        "flush=True)\ntime.sleep(60)\n"
    )
    script.chmod(0o755)
    spec = ServerSpec(
        python=str(script), model="m", extra_args=("--hf-token", "tok-abcdef"), env={"DB_PASS": "pw-123456"}
    )
    srv = VllmServer(spec, tmp_path / "s.log", stop_timeout_s=5)
    srv.start()
    deadline = time.monotonic() + 20
    while b"pw-123456" not in (tmp_path / "s.log").read_bytes() and time.monotonic() < deadline:
        time.sleep(0.05)
    running = (tmp_path / "s.log").read_text()
    assert "--hf-token <redacted>" in running.splitlines()[0] and "tok-abcdef" not in running.splitlines()[0]
    assert "pw-123456 tok-abcdef" in running  # what the server printed itself, until it stops
    assert srv.stop() == []
    after = (tmp_path / "s.log").read_text()
    assert "pw-123456" not in after and "tok-abcdef" not in after and f"{REDACTED} {REDACTED}" in after


def test_resume_restores_a_redacted_env_secret_from_the_environment_or_refuses(tmp_path, standin, capsys, monkeypatch):
    run = new_run(tmp_path, standin, server={**base_cfg(standin)["server"], "env": {"HF_TOKEN": "hf-abcdef-1"}})
    capsys.readouterr()
    before = digest(run)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    rc, err = run_cli(capsys, "--resume", run)
    assert rc == 2 and "server.env.HF_TOKEN was recorded redacted; export HF_TOKEN" in err
    assert digest(run) == before
    monkeypatch.setenv("HF_TOKEN", "hf-abcdef-1")
    assert main(["--resume", str(run), "--no-progress"]) == 1  # every cell already recorded (failed)
    assert digest(run)[CELLS] == before[CELLS]


def test_resume_refuses_a_config_whose_flag_secret_was_redacted(tmp_path, standin, capsys):
    data = base_cfg(standin)
    data["arms"][1]["args"] = ["--hf-token=hf-abcdef-2"]
    run = new_run(tmp_path, standin, arms=data["arms"])
    capsys.readouterr()
    before = digest(run)
    rc, err = run_cli(capsys, "--resume", run)
    assert rc == 2 and "arms.b.args hides a secret flag value that cannot be restored" in err
    assert digest(run) == before


# -- harness-owned flags -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, flag",
    [
        (["--host", "0.0.0.0"], "--host"),
        (["--host=0.0.0.0"], "--host"),
        (["--hos", "0.0.0.0"], "--host"),
        (["--port", "80"], "--port"),
        (["--api_key=k"], "--api-key"),
        (["--served-model-name", "x"], "--served-model-name"),
        (["--enable-prefix-caching"], "--enable-prefix-caching"),
        (["--enable-prefix"], "--enable-prefix-caching"),
        (["--no-enable-prefix-caching"], "--no-enable-prefix-caching"),
        (["--generation-config", "auto"], "--generation-config"),
        (["--model", "other"], "--model"),
        (["--tensor-parallel-size", "2"], "--tensor-parallel-size"),
        (["-tp", "2"], "--tensor-parallel-size"),
        (["-tp=2"], "--tensor-parallel-size"),
    ],
)
@pytest.mark.parametrize("where", ["server.extra_args", "arms.b.args"])
def test_args_that_override_the_harness_are_refused_even_by_dry_run(tmp_path, standin, capsys, args, flag, where):
    data = base_cfg(standin)
    if where == "server.extra_args":
        data["server"]["extra_args"] = args
    else:
        data["arms"][1]["args"] = args
    cfg = write_cfg(tmp_path / "c.toml", data)
    rc, err = run_cli(capsys, "--config", cfg, "--dry-run")
    assert rc == 2 and f"{where}: {args[0].split('=')[0]!r} sets {flag}, which the harness owns" in err
    assert "allow_harness_flag_overrides" in err and "0.0.0.0" not in err
    data["server"]["allow_harness_flag_overrides"] = True  # the documented escape hatch
    assert main(["--config", str(write_cfg(tmp_path / "c.toml", data)), "--dry-run", "--json"]) == 0


def test_ordinary_args_are_not_mistaken_for_harness_flags(tmp_path, standin, capsys):
    data = base_cfg(standin)
    data["arms"][1]["args"] = [
        "--dtype",
        "float32",
        "--tokenizer",
        "t",
        "--max-num-batched-tokens",
        "64",
        "--hf-overrides",
        "{}",
        "--max-model-len",
        "512",
    ]
    assert main(["--config", str(write_cfg(tmp_path / "c.toml", data)), "--dry-run", "--json"]) == 0
    capsys.readouterr()


def test_no_override_row_in_a_report_without_the_escape_hatch(finished_run):
    text = (finished_run / "report.md").read_text()
    assert "| run status |" in text and "harness flag overrides" not in text


# -- the plugin shim folder --------------------------------------------------------------------------
@pytest.fixture
def private_tmp(tmp_path, monkeypatch) -> Path:
    t = tmp_path / "tmp"
    t.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(t))
    return t


def test_the_shim_folder_is_created_private(private_tmp):
    shim = launch.shim_dir()
    st_ = os.lstat(shim)
    assert shim.parent == private_tmp and stat.S_IMODE(st_.st_mode) == 0o700 and st_.st_uid == os.getuid()
    assert launch.shim_dir() == shim  # idempotent


@pytest.mark.parametrize(
    "plant, why",
    [
        ("group-writable", "is writable by group or others (mode 777)"),
        ("symlink", "is not a folder (a symlink?)"),
        ("other-owner", f"is owned by uid 65534, not {os.getuid()}"),
    ],
)
def test_a_planted_shim_folder_is_refused_before_a_run_folder_exists(
    tmp_path, private_tmp, standin, capsys, plant, why
):
    shim = launch.shim_dir()
    if plant == "group-writable":
        shim.chmod(0o777)
    elif plant == "symlink":
        shutil.rmtree(shim)
        (tmp_path / "elsewhere").mkdir()
        shim.symlink_to(tmp_path / "elsewhere")
    else:
        if os.geteuid() != 0:
            pytest.skip("making a folder owned by another user needs root")
        os.chown(shim, 65534, 65534)
    cfg = write_cfg(tmp_path / "c.toml", base_cfg(standin))
    rc, err = run_cli(capsys, "--config", cfg, "--out", tmp_path / "out", "--run-id", "r")
    assert rc == 2 and f"plugin shim folder {shim} {why}: refusing" in err
    assert not (tmp_path / "out").exists()


# -- where a run folder goes; which interpreter runs ---------------------------------------------------
@pytest.mark.parametrize("run_id", ["../../x", "/abs", "a/b", "..", ".hidden", "a..b", "x\n"])
def test_a_run_id_is_a_plain_name_never_a_path(tmp_path, standin, capsys, run_id):
    (tmp_path / "results").mkdir()
    cfg = write_cfg(tmp_path / "c.toml", base_cfg(standin))
    before = digest(tmp_path)
    rid = str(tmp_path / "abs") if run_id == "/abs" else run_id
    rc, err = run_cli(capsys, "--config", cfg, "--out", tmp_path / "results", "--run-id", rid)
    assert rc == 2 and f"--run-id {rid!r}: give a plain name" in err
    assert digest(tmp_path) == before and sorted(os.listdir(tmp_path)) == ["c.toml", "results"]


@pytest.mark.parametrize("run_id", ["../../x", "a/b"])
def test_dry_run_refuses_a_run_id_that_is_not_a_plain_name(tmp_path, standin, capsys, run_id):
    rc, err = run_cli(
        capsys, "--config", write_cfg(tmp_path / "c.toml", base_cfg(standin)), "--dry-run", "--run-id", run_id
    )
    assert rc == 2 and f"--run-id {run_id!r}: give a plain name" in err


def test_a_config_name_that_is_a_path_is_refused_for_the_default_run_id(tmp_path, standin, capsys):
    data = base_cfg(standin)
    data["name"] = "../escape"
    rc, err = run_cli(capsys, "--config", write_cfg(tmp_path / "c.toml", data), "--out", tmp_path / "o")
    assert rc == 2 and "name '../escape': the config's name makes the run folder's name" in err
    assert not (tmp_path / "o").exists() and not (tmp_path / "escape").exists()


@pytest.mark.parametrize("where, kind", [("server", "missing"), ("server", "not-executable"), ("arm", "missing")])
def test_an_interpreter_that_cannot_run_is_refused_before_a_run_folder_exists(tmp_path, standin, capsys, where, kind):
    py = tmp_path / "python-x"
    if kind == "not-executable":
        py.write_text("#!/bin/sh\n")
        py.chmod(0o644)
    data = base_cfg(standin)
    if where == "server":
        data["server"]["python"] = str(py)
    else:
        data["arms"][1]["python"] = str(py)
    rc, err = run_cli(
        capsys, "--config", write_cfg(tmp_path / "c.toml", data), "--out", tmp_path / "o", "--run-id", "r"
    )
    label = "server.python" if where == "server" else "arms.b.python"
    assert rc == 2 and err == f"error: {label}: {py} {'is not executable' if kind != 'missing' else 'does not exist'}"
    assert not (tmp_path / "o").exists()


# -- config shapes the validator must refuse -----------------------------------------------------------
@pytest.mark.parametrize(
    "toml_text, msg",
    [
        ('arms = "x"\n', "arms must be [[arms]] tables"),
        ("arms = [1, 2]\n", "arms must be [[arms]] tables"),
        ('[arms]\nname = "a"\n', "arms must be [[arms]] tables"),
        ('arms = [{name = [1]}, {name = "b"}]\n', "--arms: no arm named 'a' (have: b)"),
    ],
)
def test_arms_flag_on_a_config_whose_arms_are_not_a_table_array(tmp_path, capsys, toml_text, msg):
    p = tmp_path / "c.toml"
    p.write_text(toml_text + '[model]\npath = "m"\n[workload]\ndepths = [16]\n')
    rc, err = run_cli(capsys, "--config", p, "--arms", "a", "--dry-run")
    assert rc == 2 and msg in err


@pytest.mark.parametrize(
    "mutate, msg",
    [
        (lambda d: d["arms"][1].update(name="b\n"), "arms.1.name: arm name 'b\\n' must be"),
        (lambda d: d["workload"].update(depths=[True]), "workload.depths.0: Input should be a valid integer"),
        (lambda d: d["workload"].update(rounds=True), "workload.rounds: Input should be a valid integer"),
    ],
)
def test_strict_arm_names_and_integers(tmp_path, standin, capsys, mutate, msg):
    data = base_cfg(standin)
    mutate(data)
    rc, err = run_cli(capsys, "--config", write_cfg(tmp_path / "c.toml", data), "--dry-run")
    assert rc == 2 and msg in err


def test_a_config_that_is_not_utf8_is_one_line(tmp_path, capsys):
    p = tmp_path / "c.toml"
    p.write_bytes(b'name = "\xff\xfe"\n')
    rc, err = run_cli(capsys, "--config", p, "--dry-run")
    assert rc == 2 and f"{p}: cannot read" in err and "utf-8" in err


@pytest.mark.parametrize("kind", ["fifo", "folder", "device"])
def test_a_config_that_is_not_a_regular_file_is_refused_not_waited_on(tmp_path, capsys, kind):
    # was: a FIFO's read waited for a writer forever (here a timer stands in for one, so the old
    # behaviour ends and fails instead of hanging); /dev/null read as an empty config
    p = {"fifo": tmp_path / "c.toml", "folder": tmp_path, "device": Path(os.devnull)}[kind]
    if kind == "fifo":
        os.mkfifo(p)

        def writer_at_last() -> None:
            time.sleep(5)
            with contextlib.suppress(OSError):  # ENXIO: no reader, as it should be
                os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))

        threading.Thread(target=writer_at_last, daemon=True).start()
    t0 = time.monotonic()
    rc, err = run_cli(capsys, "--config", p, "--dry-run")
    assert (
        rc == 2
        and err == f"error: {p}: not a regular file (a FIFO, socket, device or folder): give the config file itself"
    )
    assert time.monotonic() - t0 < 4
