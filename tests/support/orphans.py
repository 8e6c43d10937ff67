"""Shared by the orphan tests (issue 22): a STAND-IN server that is slow to stop and prints its
secrets, a harness started as a child process, and what its run folder holds.

The stand-in is tests/support/executor_standin.py's HTTP stand-in (a `server.python` the harness
launches exactly as it launches vLLM) with two faults a real vLLM cannot produce on demand: it
prints its whole environment (the API key and HF_TOKEN land in its log, as a crashing server's
environment dump would), and with STANDIN_IGNORE_TERM=1 it ignores SIGTERM, so that a teardown
lasts server.stop_timeout_s and only SIGKILL ends it. A harness that abandons a teardown half-way
leaves it running forever, which is what the tests look for. It also starts a child of its own
(an engine core's stand-in, as deaf to SIGTERM), in its group, that must go down with it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import psutil
import tomli_w

from tests.support import executable
from tests.support.executor_standin import STANDIN, harness
from tests.support.procs import tagged_processes, wait_for_line

HF_TOKEN = "hf_orphanTESTsecret0123456789"

ORPHAN_STANDIN = f"""#!{sys.executable}
import json, os, signal, subprocess, sys
if sys.argv[1:2] != ["-c"]:
    print("env:", json.dumps(dict(os.environ)), flush=True)
    deaf = bool(os.environ.get("STANDIN_IGNORE_TERM"))
    if deaf:
        signal.signal(signal.SIGTERM, lambda *a: print("got SIGTERM", flush=True))
    subprocess.Popen([sys.executable, "-c", "import signal, time; " +
                      ("signal.signal(signal.SIGTERM, signal.SIG_IGN); " if deaf else "") + "time.sleep(1e6)"])
""" + STANDIN.split("\n", 1)[1]


def write_standin(folder: Path) -> Path:
    return executable(folder / "vllm-orphan-standin", ORPHAN_STANDIN)


def orphan_cfg(path: Path, standin: Path, **changes) -> Path:
    """One arm, one depth, many slow rounds (a cell lasts long enough to be interrupted), a stand-in
    that ignores SIGTERM (every teardown lasts stop_timeout_s) and an HF_TOKEN in its environment."""
    data = {
        "name": "orph",
        "model": {"path": "m", "vocab_size": 1000},
        "server": {
            "python": str(standin),
            "startup_timeout_s": 30,
            "stop_timeout_s": 3,
            "env": {"STANDIN_DECODE_MS": "20", "STANDIN_IGNORE_TERM": "1"},
        },
        "workload": {"depths": [16], "rounds": 200},
        "run": {"retries": 0, "passes": 1, "order": "both"},
        "stats": {"measure_bandwidth": False},
        "gsm8k": {"enabled": False},
        "arms": [{"name": "a"}],
    }
    for k, v in changes.items():
        data[k] = {**data.get(k, {}), **v} if isinstance(v, dict) else v
    path.write_text(tomli_w.dumps(data))
    return path


def start_harness(*args: str, env: dict | None = None):
    """The harness as a child (python -c ... e2e.cli.main, SIGINT at its default) with HF_TOKEN in
    its environment and plain progress lines; returns (process, lines seen). numpy gets worker
    threads (OPENBLAS_NUM_THREADS=4, whatever the machine): the fault was a signal landing on one."""
    env = {"OPENBLAS_NUM_THREADS": "4", **(env or {}), "HF_TOKEN": HF_TOKEN}
    return harness(*map(str, args), "--no-progress", env=env), []


def start_run(cfg: Path, out: Path, run_id: str, *extra: str, env: dict | None = None):
    return start_harness("--config", cfg, "--out", out, "--run-id", run_id, *extra, env=env)


def the_server(run: Path, timeout: float = 60) -> psutil.Process:
    """The stand-in's API server process (the one with --port), once it runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in tagged_processes(run):
            try:
                if "--port" in p.cmdline():
                    return p
            except psutil.Error:
                continue
        time.sleep(0.1)
    raise AssertionError(f"no server of {run} within {timeout} s")


def wait_in_file(path: Path, needle: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file() and needle in path.read_text(errors="replace"):
            return
        time.sleep(0.05)
    raise AssertionError(f"{needle!r} not in {path} within {timeout} s")


def secrets_in(run: Path, secrets: list[str]) -> list[str]:
    """Files under run that hold any of the secrets (as `file: secret`)."""
    out = []
    for f in sorted(run.rglob("*")):
        if f.is_file():
            data = f.read_bytes()
            out += [f"{f.relative_to(run)}: {s[:6]}..." for s in secrets if s.encode() in data]
    return out


def kill_all(procs: list[psutil.Process]) -> None:
    """Test cleanup: whatever a failing case left running (never the harness's job to need this)."""
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass


def manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


def killed_harness(tmp_path: Path, standin: Path, run_id: str, *extra: str, timeout: float = 60):
    """A run whose harness was SIGKILLed mid-cell: returns (run folder, the orphan server's
    environment). The server is checked to be still running: what the next start must deal with."""
    cfg = orphan_cfg(tmp_path / f"{run_id}.toml", standin)
    run = tmp_path / run_id
    p, seen = start_run(cfg, tmp_path, run_id, *extra)
    try:
        wait_for_line(p, "measuring", seen, timeout=timeout)
        env = the_server(run).environ()
    finally:
        p.kill()
        p.wait()
    time.sleep(0.5)
    assert tagged_processes(run), "the server died with its harness: nothing to test"
    return run, env
