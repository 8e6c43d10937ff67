"""Shared by the hardening tests (issue 13): the stand-in server, a run made by the real harness,
file digests, the one-line check, and a folder made really read-only.

The STAND-IN server is used where a real vLLM cannot do on demand what is injected: it prints its
whole argv and environment (vLLM logs only its non-default args, never its environment) and exits
non-zero at once, so every place a secret can reach a file is exercised in seconds. It is a
`server.python` that the harness launches exactly as it launches vLLM.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import tomli_w

from e2e.cli import main
from tests.support import ROOT, executable  # noqa: F401 (test_hardening_folders imports ROOT from here)

STANDIN = f"""#!{sys.executable}
import json, os, sys
print("argv:", json.dumps(sys.argv))
print("env:", json.dumps(dict(os.environ)))
sys.exit(3)
"""


@pytest.fixture(scope="session")
def standin(tmp_path_factory) -> Path:
    return executable(tmp_path_factory.mktemp("standin") / "vllm-standin", STANDIN)


def base_cfg(standin: Path) -> dict:
    return {
        "name": "hard",
        "model": {"path": "m", "vocab_size": 1000},
        "server": {"python": str(standin), "startup_timeout_s": 30},
        "workload": {"depths": [16], "rounds": 1},
        "run": {"retries": 0, "passes": 1},
        "stats": {"measure_bandwidth": False},
        "gsm8k": {"enabled": False},
        "arms": [{"name": "a"}, {"name": "b"}],
    }


def write_cfg(path: Path, data: dict) -> Path:
    path.write_text(tomli_w.dumps(data))
    return path


def digest(root: Path) -> dict[str, str]:
    """Every file under root (the lock excepted: it holds the pid of whoever opened the folder)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(Path(root).rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    rc = main([str(a) for a in argv])
    return rc, one_line(capsys)


def new_run(tmp_path: Path, standin: Path, name: str = "r", **changes) -> Path:
    """A finished run made by the real harness: every cell's server (the stand-in) exits at once,
    so each cell is a failed row with its log tail; exit 1 (failed cells)."""
    data = base_cfg(standin)
    data.update(changes)
    cfg = write_cfg(tmp_path / f"{name}.toml", data)
    assert main(["--config", str(cfg), "--out", str(tmp_path), "--run-id", name, "--no-progress"]) == 1
    return tmp_path / name


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory, standin) -> Path:
    return new_run(tmp_path_factory.mktemp("finished"), standin)


@pytest.fixture
def run_copy(finished_run, tmp_path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(finished_run, dst)
    return dst


@contextmanager
def read_only(folder: Path):
    """The folder really read-only: mode bits for a normal user; a read-only bind mount for root
    (root ignores mode bits). Skips where neither is possible."""
    if os.geteuid() != 0:
        saved = [(p, p.stat().st_mode) for p in [folder, *folder.rglob("*")]]
        for p, m in saved:
            p.chmod(m & ~0o222)
        try:
            yield
        finally:
            for p, m in saved:
                p.chmod(m)
        return
    if subprocess.run(["mount", "--bind", folder, folder], capture_output=True).returncode != 0:
        pytest.skip("root without mount rights: cannot make a folder read-only here")
    try:
        if subprocess.run(["mount", "-o", "remount,bind,ro", folder, folder], capture_output=True).returncode != 0:
            pytest.skip("cannot remount read-only")
        yield
    finally:
        subprocess.run(["umount", folder], capture_output=True)
