"""What may outlive a harness, and how the next one finds it, stops it and says so.

Ownership is in the environment (e2e/serve/owners.py), so it survives any death of the harness,
SIGKILL included: every server carries E2E_SERVER_ID (its own), E2E_HARNESS = the identity of the
harness process that owns it (owners.identity: its start time in clock ticks, boot id, pid namespace) (for a Ray task's server: the driver, e2e/run/executors/ray_tasks.py);
every process of a Ray cluster the run started carries E2E_RAY_CLUSTER = the same
(e2e/run/executors/ray_cluster.py), and every server E2E_SERVER_TAG and E2E_SERVER_RUN, its run
(owners.run_marks: matched whole, never by a prefix). Such a process whose owner is gone (in this
boot and pid namespace: that pid no longer runs with that start time) is an orphan; so is any
server of a run folder whose lock the caller holds (its harness cannot be alive). An owner that
cannot be told from here (another machine, container or format) is never taken for gone.

While a server runs its run folder (a Ray node's scratch folder, for a task) holds its record,
live-servers/<server id>.json: process group, start time, tag, log, owner, and the SHA-256 of its
API key. It is written before the server is spawned and removed once teardown left nothing. A
record whose processes are all gone is what a harness that died left; its log is scrubbed (the API
key found by its digest: the key itself is never written) and the record removed. A record is
never trusted to name what to kill: e2e/serve/server_proof.py says what the process must prove.

A Ray cluster the run starts is also recorded (e2e/serve/cluster_record.py: each process's pid and
start ticks, boot id and pid namespace): Ray's agents overwrite their environment with their process title, so no marker can
be read back from them.

stop_orphans() runs at every start and --resume before anything is measured (e2e/run/session.py): an
orphan server holds its GPU and silently slows every later cell.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from e2e.rundir.formats import now
from e2e.rundir.store import inside
from e2e.safety.interrupts import held
from e2e.safety.redact import found_in_file, scrub_file, secret_values
from e2e.safety.safe_io import write_atomic
from e2e.serve.cluster_record import cluster_record_path, dead_owners_clusters, forget_cluster, record_cluster
from e2e.serve.owners import (
    CLUSTER_ENV,
    HARNESS_ENV,
    RUN_ENV,
    SERVER_ENV,
    TAG_ENV,
    identity,
    of_run,
    owner,
    owner_alive,
    process_identity,
    run_marks,
    run_of,
    set_owner,
)
from e2e.serve.server_proof import ALIVE, GONE, group_refusal, judge

# Callers read ownership (owners.py) and the cluster record (cluster_record.py) through this module.
__all__ = [
    "CLUSTER_ENV",
    "HARNESS_ENV",
    "LIVE_DIR",
    "RUN_ENV",
    "SERVER_ENV",
    "TAG_ENV",
    "Orphan",
    "clear_records",
    "cluster_record_path",
    "describe",
    "find_orphans",
    "forget",
    "forget_cluster",
    "identity",
    "key_digest",
    "mark_harness_died",
    "of_run",
    "owner",
    "owner_alive",
    "process_identity",
    "record",
    "record_cluster",
    "records",
    "run_marks",
    "scratch_root",
    "scrub_key_digests",
    "scrub_log",
    "set_owner",
    "stop_mine",
    "stop_orphans",
]

LIVE_DIR = "live-servers"
_KEY_CANDIDATE = re.compile(rb"\b[0-9a-f]{32}\b")  # launch.session_api_key: token_hex(16)


# -- the record of a live server ---------------------------------------------------------------
def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def record(live_dir: Path, server_id: str, fields: dict[str, Any]) -> None:
    """Write a live server's record (atomically: a torn record would hide the server)."""
    for attempt in range(3):  # the folder may vanish under us: forget() removes it when it empties
        live_dir.mkdir(parents=True, exist_ok=True)
        try:
            write_atomic(live_dir / f"{server_id}.json", json.dumps({"server_id": server_id, **fields}, indent=1))
            return
        except FileNotFoundError:
            if attempt == 2:
                raise


def forget(live_dir: Path, server_id: str) -> None:
    """Drop a stopped server's record, and the folder once no server runs (a finished run has none)."""
    try:
        (live_dir / f"{server_id}.json").unlink(missing_ok=True)
        live_dir.rmdir()
    except OSError:
        pass  # another server's record is there; or a read-only folder keeps the record, and the next start drops it


def records(live_dir: Path) -> list[dict[str, Any]]:
    out = []
    for p in sorted(live_dir.glob("*.json")) if live_dir.is_dir() else []:
        try:
            r = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(r, dict) and isinstance(r.get("server_id"), str):
            out.append({**r, "_path": p})
    return out


# -- scrubbing a log, whatever state the disk is in --------------------------------------------
def scrub_log(path: Path, secrets: Iterable[str]) -> None:
    """redact.scrub_file, and where that cannot write its copy (a full disk) the secrets overwritten
    in place by as many '*': the file never grows, so a full disk cannot keep a secret in a log."""
    secrets = sorted({s for s in secrets if s}, key=len, reverse=True)
    try:
        scrub_file(path, secrets)
        return
    except OSError:
        pass
    for t in Path(path).parent.glob(f".{Path(path).name}.scrub-*"):  # scrub_file's half-written copy
        t.unlink(missing_ok=True)
    try:
        with open(path, "r+b") as f:
            data = f.read()
            new = data
            for s in secrets:
                new = new.replace(s.encode(), b"*" * len(s.encode()))
            if new != data:
                f.seek(0)
                f.write(new)
    except OSError:
        pass


def scrub_key_digests(path: Path, digests: set[str], secrets: Iterable[str] = ()) -> None:
    """Scrub a log of `secrets` and of every API key whose SHA-256 is in digests (a dead harness's
    key: nothing else remembers it)."""
    # read a chunk at a time, a regular file only: a record's log may be anything
    keys = {m.decode() for m in found_in_file(Path(path), _KEY_CANDIDATE, 32) if key_digest(m.decode()) in digests}
    if keys or secrets:
        scrub_log(path, set(secrets) | keys)


# -- finding and stopping orphans --------------------------------------------------------------
@dataclass
class Orphan:
    kind: str  # "server" or "ray-cluster"
    owner: str | None
    server_id: str | None
    tag: str | None
    procs: list[psutil.Process] = field(default_factory=list)
    secrets: frozenset[str] = field(default_factory=frozenset)
    run_root: str | None = None  # the run folder its environment names (owners.run_of)


def _marked() -> Iterator[tuple[psutil.Process, dict[str, str]]]:
    """Every process on this host that a harness of this user started (directly or through its Ray
    cluster). Only this user's: another user's environment must never steer what we kill or scrub."""
    me, uid = os.getpid(), os.getuid()
    for p in psutil.process_iter(["pid", "uids"]):
        if p.pid == me or p.info["uids"] is None or p.info["uids"].real != uid:
            continue
        try:
            env = p.environ()
            if (SERVER_ENV in env or CLUSTER_ENV in env) and p.status() != psutil.STATUS_ZOMBIE:
                yield p, env
        except (psutil.Error, OSError):
            continue


def find_orphans(run_root: str | None = None) -> list[Orphan]:
    """This host's orphans: processes whose owning harness is gone, and (given run_root, whose lock
    the caller holds) every server of that run."""
    groups: dict[tuple[str, str | None], Orphan] = {}
    for p, env in _marked():
        sid, tag = env.get(SERVER_ENV), env.get(TAG_ENV)
        who = env.get(HARNESS_ENV) if sid else env.get(CLUSTER_ENV)
        mine = run_root is not None and of_run(env, run_root)
        if not mine and owner_alive(who) is not False:
            continue
        key = ("server", sid) if sid else ("ray-cluster", who)
        g = groups.setdefault(key, Orphan(key[0], who, sid, tag, run_root=run_of(env)))
        g.procs.append(p)
        g.secrets |= secret_values(env, (), [env.get("VLLM_API_KEY", "")])
    return list(groups.values())


def _kill(orphans: list[Orphan]) -> tuple[set[int], set[int]]:
    """SIGKILL every orphan process (a server's whole group: its session is its own); returns
    (killed pids, pids still alive after 10 s)."""
    procs = [p for g in orphans for p in g.procs]
    for g in orphans:
        pids = {p.pid for p in g.procs}
        for p in g.procs:
            try:
                pgid = os.getpgid(p.pid)
                if g.kind == "server" and pgid in pids and group_refusal(pgid) is None:
                    os.killpg(pgid, signal.SIGKILL)
                p.kill()
            except (psutil.Error, OSError):
                pass
    _, alive = psutil.wait_procs(procs, timeout=10)
    return {p.pid for p in procs}, {p.pid for p in alive}


def _homes(run_root: str) -> tuple[Path, Path]:
    """Where a run's servers keep logs and records on this host: its run folder, and this node's
    scratch folder of it (its Ray tasks')."""
    return Path(run_root), scratch_root(run_root)


def scratch_root(run_root: str) -> Path:
    """The run's folder on a Ray node (executors/node_side.py), the same name on every node: the
    driver's run folder hashed. Defined here because the orphan sweep looks there too."""
    tag = hashlib.sha256(run_root.encode()).hexdigest()[:10]
    return Path(tempfile.gettempdir()) / f"e2e-ray-{os.getuid()}" / f"{Path(run_root).name}-{tag}"


def _logs_of(run_root: str) -> list[Path]:
    """Every server log of a run on this host: its cells', its gsm8k units', its Ray tasks'."""
    folder, scratch = _homes(run_root)
    return (
        sorted(folder.glob("logs/*.log"))
        + sorted(folder.glob("gsm8k/*/r*/server.a*.log"))
        + sorted(scratch.glob("tasks/*/logs/*.log"))
    )


def stop_orphans(run_root: str | None = None) -> list[dict[str, Any]]:
    """Stop this host's orphans (see find_orphans), scrub their runs' logs of the secrets their
    environment held, mark each dead run's manifest `harness-died` (another run folder than
    run_root, whose lock is free), and drop their records. Returns one entry per orphan for the
    manifest of the run that found them (no secret in it). Signals are held meanwhile."""
    entries: list[dict[str, Any]] = []
    with held():
        found = find_orphans(run_root)
        seen = {p.pid for g in found for p in g.procs}
        recorded = dead_owners_clusters()
        for _, who, procs in recorded:  # what the environment scan could not see (Ray's agents)
            g = Orphan("ray-cluster", who, None, None, [p for p in procs if p.pid not in seen])
            if g.procs:
                found.append(g)
        _, alive = _kill(found)  # nothing found: nothing to wait for, and the records of gone clusters go
        for path, _, _ in recorded:
            path.unlink(missing_ok=True)
        for g in found:
            entry: dict[str, Any] = {
                "found": now(),
                "kind": g.kind,
                "owner": g.owner,
                "tag": g.tag,
                "server_id": g.server_id,
                "run": g.run_root,
                "pids": sorted(p.pid for p in g.procs),
                "still_running": sorted({p.pid for p in g.procs} & alive),
            }
            entries.append({k: v for k, v in entry.items() if v is not None})
            root = g.run_root
            if root:
                for log in _logs_of(root):
                    scrub_log(log, g.secrets)
                if g.server_id and not entry["still_running"]:
                    for home in _homes(root):
                        forget(home / LIVE_DIR, g.server_id)
        for root in sorted({g.run_root for g in found if g.run_root and g.run_root != run_root}):
            mark_harness_died(Path(root), [e for e in entries if e.get("run") == root])
    return entries


def clear_records(run_root: Path, secrets: Iterable[str] = ()) -> list[dict[str, Any]]:
    """The records of a run whose lock the caller holds, once stop_orphans has run: each names a
    server its dead harness left. One whose process proves it is that server of this run, still
    running (e2e/serve/server_proof.py; stop_orphans should have stopped it) has its group killed;
    one whose process is gone has its log scrubbed (of `secrets`, and of the key found by its
    digest) and is dropped; any other is left alone, record included. Returns an entry per record
    killed here or left alone (its reason: one line of describe())."""
    out = []
    run = str(Path(run_root).resolve())
    for r in records(Path(run_root) / LIVE_DIR):
        verdict, why = judge(r, run)
        entry = {"found": now(), "kind": "server", "owner": r.get("owner"), "tag": r.get("tag")}
        entry.update(server_id=r["server_id"], run=run, record=r["_path"].name)
        if verdict == ALIVE:
            try:
                os.killpg(int(why), signal.SIGKILL)
                out.append({**entry, "pids": [int(why)], "by": "record"})
            except OSError:
                pass
        elif verdict != GONE:
            out.append({**entry, "kind": "left-alone", "why": why})
            continue
        # a record is data: its log is scrubbed only when it names a regular file inside the run folder,
        # and the record itself is dropped by the name it was read from, never by a name it holds
        log = inside(Path(run_root), r.get("log"))
        if log is not None:
            scrub_key_digests(log, {r.get("key_sha256") or ""}, secrets)
        forget(Path(run_root) / LIVE_DIR, r["_path"].stem)
    return out


def stop_mine(run_root: str) -> list[int]:
    """The last word at the end of a session: every server of run_root that this harness owns on
    this host and that still runs (a teardown cut short where nothing else caught it) is killed and
    its run's logs scrubbed. Returns the pids found (should be [])."""
    me = owner()
    mine: list[Orphan] = []
    with held():
        mine = [
            Orphan(
                "server",
                me,
                env.get(SERVER_ENV),
                env.get(TAG_ENV),
                [p],
                secret_values(env, (), [env.get("VLLM_API_KEY", "")]),
                run_root,
            )
            for p, env in _marked()
            if env.get(SERVER_ENV) and env.get(HARNESS_ENV) == me and of_run(env, run_root)
        ]
        if mine:
            _kill(mine)
            for root in {g.run_root for g in mine if g.run_root}:
                for log in _logs_of(root):
                    scrub_log(log, set().union(*(g.secrets for g in mine)))
    return sorted(p.pid for g in mine for p in g.procs)


# -- a run whose harness died (its status: e2e/rundir/store.py, harness_gone) ------------------
def mark_harness_died(run_root: Path, stopped: list[dict[str, Any]]) -> None:
    """Best effort, another run's folder: status `harness-died` (if it said running) and what was
    stopped of it. Skipped when its lock is held (then its harness lives) or it cannot be written."""
    from e2e.errors import UserError
    from e2e.rundir.store import RunStore

    if not (Path(run_root) / "manifest.json").is_file():
        return
    store = RunStore(Path(run_root))
    try:
        store.lock()
    except UserError:
        return
    try:
        m = store.manifest()
        update: dict[str, Any] = {"orphans_stopped": (m.get("orphans_stopped") or []) + stopped}
        if m.get("status") == "running":
            update.update(status="harness-died", harness_died={"found": now(), "by": owner()})
        store.update_manifest(**update)
    except (UserError, OSError):
        pass
    finally:
        store.close()


def describe(entries: list[dict[str, Any]]) -> str:
    """The console line for what stop_orphans (and clear_records) found, and one line per record
    left alone."""
    servers = [e for e in entries if e["kind"] == "server"]
    cluster = [p for e in entries if e["kind"] == "ray-cluster" for p in e["pids"]]
    runs = sorted({e.get("run") or run_of({TAG_ENV: e.get("tag") or ""}) or "" for e in servers} - {""})
    what = ([f"{len(servers)} server(s) of {', '.join(runs) or 'an untagged run'}"] if servers else []) + (
        [f"{len(cluster)} process(es) of its Ray cluster"] if cluster else []
    )
    left = sorted(p for e in entries for p in e.get("still_running", []))
    lines = []
    if what:
        lines.append(
            f"stopped what a harness that died left running: {'; '.join(what)} (their logs scrubbed)"
            + (f"; STILL RUNNING after SIGKILL: pids {left}" if left else "")
        )
    for e in entries:
        if e["kind"] == "left-alone":
            lines.append(f"left alone: {e['run']}/{LIVE_DIR}/{e['record']} {e['why']}; nothing was signalled")
    return "\n".join(lines)
