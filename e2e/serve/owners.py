"""Who owns a process the harness started: the environment names it, so it survives any death of
the harness, SIGKILL included (e2e/serve/live_servers.py finds and stops what a dead owner left).

    E2E_SERVER_ID    a server's own id (every process of its group inherits it)
    E2E_HARNESS      <host>/<boot id>/<pid namespace>/<pid>/<start ticks> of the harness that owns the server
    E2E_RAY_CLUSTER  the same, on every process of a Ray cluster the harness started
    E2E_SERVER_TAG   <run folder>::<server key>: which run (and which of its servers) it belongs to
    E2E_SERVER_RUN   the run folder's digest (run_digest): what the sweeps match, whole, never a prefix

A process is named by what the kernel keeps and no clock step moves: its start time in clock ticks
since boot (/proc/<pid>/stat field 22), with the boot id and the pid namespace the pid is read in.
The host name is there for people only: a container on this host may share it, with its own pids.
"""

from __future__ import annotations

import functools
import hashlib
import os
import socket
from collections.abc import Mapping

import psutil

HARNESS_ENV = "E2E_HARNESS"
CLUSTER_ENV = "E2E_RAY_CLUSTER"
SERVER_ENV = "E2E_SERVER_ID"
TAG_ENV = "E2E_SERVER_TAG"
RUN_ENV = "E2E_SERVER_RUN"

_owner: str | None = None
_SAME_START_S = 0.05  # psutil's create_time of one process reads the same each time, to the clock tick


def start_ticks(pid: int) -> int | None:
    """The kernel's start time of pid, in clock ticks since boot (None: no such process here)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        # the name (field 2) may hold spaces and parentheses: fields 3.. follow its last ')'
        return int(stat[stat.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


@functools.cache
def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


@functools.cache
def pid_namespace() -> int:
    """The inode of this process's pid namespace: a pid means the same process only within one."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def same_process(pid: int, ticks: object) -> bool:
    """Whether pid (in this pid namespace) is still the process that started at `ticks`."""
    return isinstance(ticks, int) and not isinstance(ticks, bool) and start_ticks(pid) == ticks


def still(pid: int, started: float) -> psutil.Process | None:
    """The process `pid` if it is still the one that started at `started` (pids are reused).
    Wall-clock: all that a record of the earlier format holds (a live server's, a Ray cluster's);
    a clock step makes a process look gone here, never another one look like it."""
    try:
        p = psutil.Process(pid)
        return p if abs(p.create_time() - started) < _SAME_START_S else None
    except psutil.Error:
        return None


def identity(pid: int | None = None) -> str:
    """<host>/<boot id>/<pid namespace>/<pid>/<start ticks>: a process, never mistaken for a later
    one that reuses its pid, nor for one of another container or boot."""
    pid = os.getpid() if pid is None else pid
    ticks = start_ticks(pid)
    if ticks is None:
        raise psutil.NoSuchProcess(pid)
    return f"{socket.gethostname()}/{boot_id()}/{pid_namespace()}/{pid}/{ticks}"


def process_identity(pid: int) -> dict[str, object]:
    """What a record keeps to know pid again (e2e/serve/server_proof.py): its start ticks, in this
    boot and pid namespace."""
    return {"pid_ticks": start_ticks(pid), "boot_id": boot_id(), "pid_ns": pid_namespace()}


def owner() -> str:
    """The harness that owns the servers this process starts: this process, or the Ray driver a
    task runs for (set_owner)."""
    return _owner or identity()


def set_owner(ident: str | None) -> None:
    global _owner
    _owner = ident


def owner_alive(ident: str | None) -> bool | None:
    """Whether that harness still runs; None when it cannot be told from here: another machine or
    boot, another pid namespace (a container), no owner, or an identity of the earlier format
    (<host>/<pid>/<wall-clock start>, which a clock step falsifies)."""
    try:
        _, boot, ns, pid, ticks = (ident or "").split("/")
        pid_n, ticks_n, ns_n = int(pid), int(ticks), int(ns)
    except ValueError:
        return None
    if boot != boot_id() or ns_n != pid_namespace():
        return None
    if not same_process(pid_n, ticks_n):
        return False
    try:
        return psutil.Process(pid_n).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def run_digest(run_root: str) -> str:
    """A run folder (resolved, as its servers' tags give it) as a fixed-length name: equal digests,
    same folder; no folder's digest is a prefix of another's, whatever `::` its name holds."""
    return hashlib.sha256(str(run_root).encode()).hexdigest()[:32]


def run_marks(run_root: str, key: str) -> dict[str, str]:
    """The environment that names a server of the run at run_root (resolved) by its key."""
    return {TAG_ENV: f"{run_root}::{key}", RUN_ENV: run_digest(run_root)}


def run_of(env: Mapping[str, str]) -> str | None:
    """The run folder a server's environment names: the part of its tag before a `::` whose digest
    is E2E_SERVER_RUN. A server of the earlier format (a tag alone): before the last `::`, the
    harness's keys holding none."""
    tag, digest = env.get(TAG_ENV), env.get(RUN_ENV)
    if not tag or "::" not in tag:
        return None
    if digest is None:
        return tag.rsplit("::", 1)[0]
    parts = tag.split("::")
    return next((r for i in range(1, len(parts)) if run_digest(r := "::".join(parts[:i])) == digest), None)


def of_run(env: Mapping[str, str], run_root: str, key: str | None = None) -> bool:
    """Whether that environment is a server's of the run at run_root (of its server `key`, if given)."""
    if run_of(env) != str(run_root):
        return False
    return key is None or env.get(TAG_ENV) == f"{run_root}::{key}"
