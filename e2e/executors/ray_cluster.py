"""The Ray cluster a run uses: connect (or start a local one), find the slots, probe what every node
would run, and refuse what cannot give one answer per arm (another vLLM version on another node,
a missing interpreter or model). All of it before the run folder is written."""
from __future__ import annotations

import logging
import os
import signal
import socket
from pathlib import Path
from typing import Any

try:
    import ray
except ImportError:  # still importable without the extra (a clean install); create() names the package
    ray = None

from e2e.config import Config
from e2e.errors import UserError
from e2e.executors.slots import Slot, make_slots
from e2e.executors.versions import arm_versions
from e2e.launch import server_python


def connect(address: str | None) -> bool:
    """ray.init on `address` (a running cluster: "auto", "host:port", "ray://host:port") or, with
    None, a new local cluster for this run. Returns whether this process started the cluster.
    ray.init installs its own SIGTERM handler; the harness's (SIGTERM = Ctrl-C) is put back."""
    if address and address != "auto":
        reachable(address)
    term = signal.getsignal(signal.SIGTERM)
    kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                          "logging_level": logging.WARNING, "configure_logging": True}
    if address is None:  # a small object store: rows and logs are small, the host is shared
        kw["object_store_memory"] = 256 * 2**20
    try:
        ray.init(address=address or "local", **kw)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise UserError(f"--ray-address {address}: cannot connect to a Ray cluster: {first}") from None
    finally:
        if term is not None:
            signal.signal(signal.SIGTERM, term)
    return address is None


def reachable(address: str, timeout_s: float = 10.0) -> None:
    """HOST:PORT (or ray://HOST:PORT) answers TCP: ray.init would otherwise retry for minutes."""
    hostport = address.split("://", 1)[-1].rsplit("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"--ray-address {address!r}: give auto, HOST:PORT or ray://HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise UserError(f"--ray-address {address}: nothing answers there ({exc.strerror or exc}); "
                        "is the cluster up (ray start --head)?") from None


def on_node(node_id: str) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    return NodeAffinitySchedulingStrategy(node_id, soft=False)


def alive_node_ids() -> set[str]:
    return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}


def find_slots(cfg: Config, max_per_host: int, max_slots: int | None,
               cpus_per_cell: float | None) -> list[Slot]:
    return make_slots(ray.nodes(), cfg.server.tensor_parallel_size, max_per_host, max_slots, cpus_per_cell)


def probe_nodes(cfg: Config, slots: list[Slot]) -> dict[str, dict[str, Any]]:
    """node_id -> {name, host, hostname, installations (per interpreter), gpu}, probed on the node."""
    from e2e.executors.ray_tasks import probe

    pythons = sorted({server_python(cfg, a) for a in cfg.arms})
    model = cfg.model.path
    paths = [model] if Path(model).exists() else []  # a hub name is no path to check
    nodes = {s.node_id: s for s in slots}
    refs = {nid: probe.options(scheduling_strategy=on_node(nid)).remote(pythons, paths, os.getcwd())
            for nid in nodes}
    out = {}
    for nid, ref in refs.items():
        name = nodes[nid].name.split(".")[0]
        try:
            got = ray.get(ref, timeout=300)
        except ray.exceptions.RayError as exc:
            first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            raise UserError(f"node {name} ({nodes[nid].host}) cannot run the harness: {first}; every node "
                            "needs this project importable (pip install -e . or the same checkout)") from None
        if got["missing"]:
            raise UserError(f"model.path {got['missing'][0]}: not found on node {name} ({nodes[nid].host}); "
                            "every node needs the model at the same path")
        where = f"node {name} ({nodes[nid].host})"
        out[nid] = {"name": name, "host": nodes[nid].host, "hostname": got["host"].get("hostname"),
                    "arm_vllm": arm_versions(cfg, got["installations"], where, got["runnable"]),
                    "installations": got["installations"], "gpu": got["gpu"]}
    return out
