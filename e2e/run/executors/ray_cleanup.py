"""What a Ray run leaves on its nodes, found and stopped: before the first task, what dead harnesses
left on every live node; after a lost task, its group's processes on its node (and the logs it left
in scratch); at the end, every used node swept of this run's servers. Also the one warning about a
cluster anyone on its network can reach. The driver (ray_executor.py) calls these; the tasks
themselves are ray_tasks.py's."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

try:
    import ray
except ImportError:  # still importable without the extra (a clean install); create() names the package
    ray = None  # type: ignore[assignment]

from e2e.run.executors import ray_cluster as rc
from e2e.run.executors.ray_tasks import stop_orphans, sweep
from e2e.serve import live_servers

Note = Callable[[str], None]


def exposure_warnings(started_cluster: bool, security: dict[str, Any]) -> list[str]:
    """Console warnings, before the first task, for a cluster that others could reach."""
    out = []
    if started_cluster and security.get("listening") != "127.0.0.1 only":
        out.append(
            f"warning: the Ray cluster started for this run listens beyond loopback: {security.get('listening')}"
        )
    if security.get("auth") != "token":
        out.append(
            f"warning: Ray traffic is not authenticated (auth {security.get('auth')}): anyone who "
            "can reach the cluster's ports can run code on it (docs/guides/ray.md, Security)"
        )
    return out


def stop_orphans_everywhere(run_root: str, names: dict[str, str], note: Note) -> list[dict[str, Any]]:
    """On every live node, what a dead harness left (this run's servers above all, on a resume),
    stopped; one console line per node that had any. Returns the entries for the manifest."""
    refs = {
        nid: stop_orphans.options(scheduling_strategy=rc.on_node(nid)).remote(run_root) for nid in rc.alive_node_ids()
    }
    found: list[dict[str, Any]] = []
    for nid, ref in refs.items():
        try:
            got = ray.get(ref, timeout=60)
        except ray.exceptions.RayError:
            continue
        if got:
            note(f"node {names.get(nid, nid[:8])}: {live_servers.describe(got)}")
            found += got
    return found


def sweep_group(run_root: str, node_id: str, key: str, hidden: tuple[str, ...]) -> dict[str, Any] | None:
    """A lost task's group on its (live) node: its processes killed, and what it left in scratch
    handed back (`files`, logs scrubbed of `hidden`); None when the node did not answer."""
    try:
        got: dict[str, Any] = ray.get(
            sweep.options(scheduling_strategy=rc.on_node(node_id)).remote(run_root, key, hidden), timeout=60
        )
    except ray.exceptions.RayError:
        return None
    return got


def sweep_nodes(run_root: str, node_ids: Iterable[str], remove_scratch: bool = False) -> dict[str, list[int]]:
    """Every live node of node_ids swept of this run's servers (and its scratch folder removed, at
    the end). Returns the pids killed per node that answered."""
    alive = rc.alive_node_ids()
    refs = {
        nid: sweep.options(scheduling_strategy=rc.on_node(nid)).remote(run_root, None, (), remove_scratch)
        for nid in node_ids
        if nid in alive
    }
    killed: dict[str, list[int]] = {}
    for nid, ref in refs.items():
        try:
            killed[nid] = ray.get(ref, timeout=60)["killed"]
        except ray.exceptions.RayError:
            continue
    return killed
