"""The record of a Ray cluster the harness started: each process's pid and start time, in
<tmp>/e2e-ray-<uid>/clusters/, a folder that must be this user's alone. Ray's agents overwrite their
environment with their process title, so no marker can be read back from them; the next harness
finds a dead owner's cluster by this record (e2e/serve/live_servers.py stop_orphans)."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

import psutil

from e2e.serve.owners import owner, owner_alive, still


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
    pids = []
    for p in procs:
        try:
            pids.append([p.pid, p.create_time()])
        except psutil.Error:
            continue
    try:
        path.write_text(json.dumps({"owner": owner(), "pids": pids}))
    except OSError:
        pass


def forget_cluster() -> None:
    path = cluster_record_path(owner())
    if path is not None:
        path.unlink(missing_ok=True)


def dead_owners_clusters() -> list[tuple[Path, str, list[psutil.Process]]]:
    """Cluster records whose owner is gone: (record, owner, what of the cluster still runs: same
    pid, same start time, this user's)."""
    d = _clusters_dir()
    out = []
    for path in sorted(d.glob("*.json")) if d else []:
        try:
            r = json.loads(path.read_text())
            who, pids = r["owner"], [(int(a), float(b)) for a, b in r["pids"]]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if owner_alive(who) is not False:
            continue
        procs = []
        for pid, t0 in pids:
            p = still(pid, t0)
            try:
                if p is not None and p.uids().real == os.getuid() and p.status() != psutil.STATUS_ZOMBIE:
                    procs.append(p)
            except psutil.Error:
                continue
        out.append((path, who, procs))
    return out
