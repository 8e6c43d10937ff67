"""Find processes a run started, by the run marks every server process inherits; follow a
harness subprocess's output."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import psutil

from e2e.serve import live_servers


def tagged_processes(run_root: Path) -> list[psutil.Process]:
    """Live processes whose environment names this run folder (servers that should be gone)."""
    run = str(Path(run_root).resolve())
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if live_servers.of_run(p.environ(), run) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.Error, OSError):
            continue
    return out


def wait_for_line(proc: subprocess.Popen, needle: str, seen: list[str], timeout: float = 600) -> str:
    """Read proc's output (kept in `seen`) until a line contains needle; returns that line."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"harness ended before {needle!r}:\n{''.join(seen)}")
        seen.append(line)
        if needle in line:
            return line
    raise AssertionError(f"no {needle!r} within {timeout} s:\n{''.join(seen)}")
