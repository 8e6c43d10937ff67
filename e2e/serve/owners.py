"""Who owns a process the harness started: the environment names it, so it survives any death of
the harness, SIGKILL included (e2e/serve/live_servers.py finds and stops what a dead owner left).

    E2E_SERVER_ID    a server's own id (every process of its group inherits it)
    E2E_HARNESS      <host>/<pid>/<start time> of the harness that owns the server
    E2E_RAY_CLUSTER  the same, on every process of a Ray cluster the harness started
    E2E_SERVER_TAG   <run folder>::<server key>: which run (and which of its servers) it belongs to
"""

from __future__ import annotations

import socket

import psutil

HARNESS_ENV = "E2E_HARNESS"
CLUSTER_ENV = "E2E_RAY_CLUSTER"
SERVER_ENV = "E2E_SERVER_ID"
TAG_ENV = "E2E_SERVER_TAG"

_owner: str | None = None
_SAME_START_S = 0.05  # psutil's create_time of one process reads the same each time, to the clock tick


def still(pid: int, started: float) -> psutil.Process | None:
    """The process `pid` if it is still the one that started at `started` (pids are reused)."""
    try:
        p = psutil.Process(pid)
        return p if abs(p.create_time() - started) < _SAME_START_S else None
    except psutil.Error:
        return None


def identity(pid: int | None = None) -> str:
    """<host>/<pid>/<start time>: a process, never mistaken for a later one that reuses its pid."""
    p = psutil.Process(pid)
    return f"{socket.gethostname()}/{p.pid}/{p.create_time():.2f}"


def owner() -> str:
    """The harness that owns the servers this process starts: this process, or the Ray driver a
    task runs for (set_owner)."""
    return _owner or identity()


def set_owner(ident: str | None) -> None:
    global _owner
    _owner = ident


def owner_alive(ident: str | None) -> bool | None:
    """Whether that harness still runs; None when it cannot be told from here (another host, or no
    owner recorded)."""
    try:
        host, pid, started = (ident or "").rsplit("/", 2)
        pid_n, t0 = int(pid), float(started)
    except ValueError:
        return None
    if host != socket.gethostname():
        return None
    p = still(pid_n, t0)
    try:
        return p is not None and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
