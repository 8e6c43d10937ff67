"""What a record of a live server (e2e/serve/live_servers.py) must prove before its group is
signalled. A record is data in a run folder, which anyone who can write there can plant: it is
acted on only where the process itself proves it is that server of that run.

    its own environment (/proc/<pid>/environ, a process of this user) carries the record's server
      id and this run's marks (owners.of_run);
    it leads its own session and group (a server starts with start_new_session), the group the
      record names;
    that group is never 0 or 1, nor this process's own group or its parent's;
    it is the very process recorded: the kernel's start time in clock ticks, in the same boot and
      pid namespace (owners.identity). A record of the earlier format (a wall-clock start time only)
      proves nothing by its time: the environment alone decides there.

Whatever fails is left alone with the reason why; a record whose process is gone is stale.
"""

from __future__ import annotations

import os
from typing import Any

import psutil

from e2e.serve.owners import SERVER_ENV, boot_id, of_run, pid_namespace, same_process, still

ALIVE, GONE, REFUSED = "alive", "gone", "refused"


def group_refusal(pgid: object) -> str | None:
    """Why the process group pgid must never be signalled by a sweep, or None."""
    if not isinstance(pgid, int) or isinstance(pgid, bool):
        return f"names no process group ({pgid!r})"
    if pgid <= 1:
        return f"names process group {pgid}"
    if pgid == os.getpgrp():
        return f"names this harness's own process group {pgid}"
    try:
        if pgid == os.getpgid(os.getppid()):
            return f"names the process group {pgid} of this harness's parent"
    except OSError:
        pass
    return None


def judge(r: dict[str, Any], run: str) -> tuple[str, str]:
    """(ALIVE, pgid proven) | (GONE, why) | (REFUSED, why) for the record r of the run folder `run`
    (resolved): ALIVE only where every check above holds."""
    pgid = r.get("pgid")
    if pgid is None:
        return GONE, "written before its server was spawned"
    why = group_refusal(pgid)
    if why is not None:
        return REFUSED, why
    assert isinstance(pgid, int)
    if r.get("pid", pgid) != pgid:
        return REFUSED, f"names group {pgid} of another process ({r.get('pid')!r})"
    ticks = r.get("pid_ticks")
    if ticks is not None:
        if r.get("boot_id") != boot_id():
            return GONE, "recorded before this machine last booted"
        if r.get("pid_ns") != pid_namespace():
            return REFUSED, f"names pid {pgid} of another pid namespace (a container?)"
        if not same_process(pgid, ticks):
            return GONE, "its process is gone"
    elif not _maybe_running(pgid, r.get("pid_started")):
        return GONE, "its process is gone"
    return _proven(r, pgid, run)


def _maybe_running(pid: int, t0: object) -> bool:
    """An earlier-format record: whether pid may still be the one recorded (its wall-clock start
    time, the only thing it has). A clock step makes it look gone: the record is dropped then, and
    the process, if it is ours, still found by its environment."""
    try:
        return isinstance(t0, int | float | str) and still(pid, float(t0)) is not None
    except ValueError:
        return False


def _proven(r: dict[str, Any], pgid: int, run: str) -> tuple[str, str]:
    try:
        p = psutil.Process(pgid)
        uids, env = p.uids(), p.environ()
        sid, group = os.getsid(pgid), os.getpgid(pgid)
    except (psutil.NoSuchProcess, ProcessLookupError):
        return GONE, "its process is gone"
    except (psutil.Error, OSError) as exc:
        return REFUSED, f"pid {pgid}: its environment cannot be read ({type(exc).__name__})"
    if uids.real != os.getuid():
        return REFUSED, f"pid {pgid} is another user's"
    if env.get(SERVER_ENV) != r.get("server_id") or not of_run(env, run):
        return REFUSED, f"pid {pgid} is not that server of this run (its environment says otherwise)"
    if sid != pgid or group != pgid:
        return REFUSED, f"pid {pgid} does not lead its own session"
    return ALIVE, str(pgid)
