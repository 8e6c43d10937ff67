"""The record of a Ray cluster the harness started: each process's pid and its identity (start time
in clock ticks since boot, boot id, pid namespace: owners.process_identity, which no clock step
moves), in <tmp>/e2e-ray-<uid>/clusters/, a folder that must be this user's alone. Ray's agents
overwrite their environment with their process title, so no marker can be read back from them; the
next harness finds a dead owner's cluster by this record (e2e/serve/live_servers.py stop_orphans).
A record of the earlier format ("pids": [pid, wall-clock start] pairs) is still read: a clock step
makes its processes look gone there, never another process look like one of them."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import psutil

from e2e.serve.owners import boot_id, owner, owner_alive, pid_namespace, process_identity, same_process, still


def _clusters_dir() -> Path | None:
    """<tmp>/e2e-ray-<uid>/clusters, made private; None when it or its parent is not this user's
    alone (a record planted there would name the processes we kill)."""
    base = Path(tempfile.gettempdir()) / f"e2e-ray-{os.getuid()}"
    d = base / "clusters"
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        for p in (base, d):
            st = os.lstat(p)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                return None
    except OSError:
        return None
    return d


def cluster_record_path(owner_id: str) -> Path | None:
    """Where the record of the cluster that owner_id started lives (None: no private folder)."""
    d = _clusters_dir()
    return d / (owner_id.replace("/", "_") + ".json") if d else None


def record_cluster(procs: Iterable[psutil.Process]) -> None:
    """The processes of the Ray cluster this harness just started (best effort)."""
    path = cluster_record_path(owner())
    if path is None:
        return
    known = [{"pid": p.pid, **ident} for p in procs if (ident := process_identity(p.pid))["pid_ticks"] is not None]
    try:
        path.write_text(json.dumps({"owner": owner(), "procs": known}))
    except OSError:
        pass


def forget_cluster() -> None:
    path = cluster_record_path(owner())
    if path is not None:
        path.unlink(missing_ok=True)


def _recorded(r: Mapping[str, object]) -> list[psutil.Process]:
    """The processes a record names that are still the very ones recorded (TypeError, ValueError,
    KeyError: not a record of either format)."""
    if "procs" not in r:  # the earlier format: [pid, wall-clock start]
        pids = r["pids"]
        if not isinstance(pids, list):
            raise TypeError("pids")
        return [p for a, b in pids if (p := still(int(a), float(b))) is not None]
    procs = r["procs"]
    if not isinstance(procs, list) or not all(isinstance(e, dict) for e in procs):
        raise TypeError("procs")
    out = []
    for e in procs:
        pid = e.get("pid")
        if e.get("boot_id") != boot_id() or e.get("pid_ns") != pid_namespace() or not isinstance(pid, int):
            continue  # another boot or pid namespace: that pid is not the process recorded
        if same_process(pid, e.get("pid_ticks")):
            try:
                out.append(psutil.Process(pid))
            except psutil.Error:
                continue
    return out


def dead_owners_clusters() -> list[tuple[Path, str, list[psutil.Process]]]:
    """Cluster records whose owner is gone: (record, owner, what of the cluster still runs: the very
    process recorded, this user's)."""
    d = _clusters_dir()
    out = []
    for path in sorted(d.glob("*.json")) if d else []:
        try:
            r = json.loads(path.read_text())
            if not isinstance(who := r["owner"], str) or owner_alive(who) is not False:
                continue
            recorded = _recorded(r)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        procs = []
        for p in recorded:
            try:
                if p.uids().real == os.getuid() and p.status() != psutil.STATUS_ZOMBIE:
                    procs.append(p)
            except psutil.Error:
                continue
        out.append((path, who, procs))
    return out
