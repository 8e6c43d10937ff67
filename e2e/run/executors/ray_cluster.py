"""The Ray cluster a run uses: connect (or start a local one, on loopback and token-authenticated),
find the slots, probe what every node would run, and refuse what cannot give one answer per arm
(another vLLM version on another node, a missing interpreter or model). All of it before the run
folder is written."""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

try:
    import ray
except ImportError:  # still importable without the extra (a clean install); create() names the package
    ray = None  # type: ignore[assignment]

import psutil

from e2e.design.config import Config
from e2e.errors import UserError
from e2e.run.executors.slots import Slot, make_slots
from e2e.run.executors.versions import arm_versions
from e2e.serve import live_servers
from e2e.serve.launch import server_python

# A cluster this run starts is Ray's single-machine cluster (what Ray runs on macOS and Windows,
# RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0): GCS, raylet, workers, agents and the driver then listen on
# 127.0.0.1 only. Otherwise (Ray 2.60, read in its source and seen) ray.init turns a 127.0.0.1 node
# address into the host's address and the gRPC servers listen on every interface. Its traffic is
# token-authenticated (RAY_AUTH_MODE=token, in recent Rays only) with a token made for the run, held
# in the environment of the cluster's processes and never written to a file (Ray's own default
# writes ~/.ray/auth_token). A RAY_AUTH_MODE or token the user set stands. Ray reads both at
# import, so the driver's copy is refreshed the way ray.init does when it enables token mode itself.
_SINGLE_MACHINE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
_saved: dict[str, Any] = {}  # what _set_env changed, for restore_env


def own_cluster_env() -> dict[str, str]:
    """The environment a cluster started for this run needs (see above)."""
    env = {_SINGLE_MACHINE: "0", live_servers.CLUSTER_ENV: live_servers.owner()}
    if "RAY_AUTH_MODE" not in os.environ:
        env["RAY_AUTH_MODE"] = "token"
    if not os.environ.get("RAY_AUTH_TOKEN") and not os.environ.get("RAY_AUTH_TOKEN_PATH"):
        env["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    return env


def _set_env(env: Mapping[str, str | None], single_machine: bool) -> None:
    from ray._private import ray_constants

    _saved.setdefault("single_machine", not ray_constants.ENABLE_RAY_CLUSTER)
    for k, v in env.items():
        _saved.setdefault(k, os.environ.get(k))
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    ray_constants.ENABLE_RAY_CLUSTER = not single_machine
    try:
        # not in ray._raylet's stub
        from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]
    except ImportError:  # a Ray without token authentication (< 2.52)
        return
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def restore_env() -> None:
    """After ray.shutdown: the environment as it was before connect (later runs in this process)."""
    if _saved:
        old = dict(_saved)
        _saved.clear()
        single = old.pop("single_machine")
        _set_env(old, single)
        _saved.clear()


def connect(address: str | None) -> bool:
    """ray.init on `address` (a running cluster: "auto", "host:port", "ray://host:port") or, with
    None, a new local cluster for this run (loopback only, token-authenticated: see above). Returns
    whether this process started the cluster.
    ray.init installs its own SIGTERM handler; the harness's (SIGTERM = Ctrl-C) is put back."""
    if address and address != "auto":
        reachable(address)
    term = signal.getsignal(signal.SIGTERM)
    kw: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": False,
        "logging_level": logging.WARNING,
        "configure_logging": True,
    }
    if address is None:  # a small object store: rows and logs are small, the host is shared
        kw["object_store_memory"] = 256 * 2**20
        _set_env(own_cluster_env(), single_machine=True)
    connected = False
    try:
        ray.init(address=address or "local", **kw)
        connected = True
    except (ConnectionError, ValueError, RuntimeError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise UserError(f"--ray-address {address}: cannot connect to a Ray cluster: {first}") from None
    finally:
        if address is None:  # its agents hide their environment: by pid too, for a start after our
            live_servers.record_cluster(psutil.Process().children(recursive=True))  # death (or a failed init)
        if not connected:
            restore_env()
        if term is not None:
            signal.signal(signal.SIGTERM, term)
        os.environ.pop(live_servers.CLUSTER_ENV, None)  # the cluster's processes have it; later children not
    return address is None


def exposure(started: bool) -> dict[str, Any]:
    """What protects the cluster, as seen once connected: Ray's authentication mode and, for a
    cluster this run started, every address its processes listen on (checked, not assumed)."""
    try:
        # not in ray._raylet's stub
        from ray._raylet import AuthenticationMode, get_authentication_mode  # type: ignore[attr-defined]

        auth = "token" if get_authentication_mode() == AuthenticationMode.TOKEN else "none"
    except ImportError:
        auth = f"none (Ray {ray.__version__} has no token authentication)"
    if not started:
        return {"auth": auth, "listening": "as the cluster at --ray-address was started"}
    me = psutil.Process()
    wide = set()
    for p in [me, *me.children(recursive=True)]:
        try:
            conns = p.net_connections("inet") if hasattr(p, "net_connections") else p.connections("inet")
        except psutil.Error:
            continue
        wide |= {
            f"{c.laddr.ip}:{c.laddr.port}"
            for c in conns
            if c.status == psutil.CONN_LISTEN and not _loopback(c.laddr.ip)
        }
    return {"auth": auth, "listening": sorted(wide) if wide else "127.0.0.1 only"}


def _loopback(ip: str) -> bool:
    return ip.startswith("127.") or ip in ("::1", "::ffff:127.0.0.1") or ip.startswith("::ffff:127.")


def reachable(address: str, timeout_s: float = 10.0) -> None:
    """HOST:PORT (or ray://HOST:PORT) answers TCP: ray.init would otherwise retry for minutes."""
    hostport = address.split("://", 1)[-1].rsplit("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"--ray-address {address!r}: give auto, HOST:PORT or ray://HOST:PORT")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise UserError(
            f"--ray-address {address}: nothing answers there ({exc.strerror or exc}); "
            "is the cluster up (ray start --head)?"
        ) from None


def on_node(node_id: str) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id, soft=False)


def alive_node_ids() -> set[str]:
    return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}


def find_slots(cfg: Config, max_per_host: int, max_slots: int | None, cpus_per_cell: float | None) -> list[Slot]:
    return make_slots(ray.nodes(), cfg.server.tensor_parallel_size, max_per_host, max_slots, cpus_per_cell)


def probe_nodes(cfg: Config, slots: list[Slot]) -> dict[str, dict[str, Any]]:
    """node_id -> {name, host, hostname, installations (per interpreter), gpu}, probed on the node."""
    from e2e.run.executors.ray_tasks import probe

    pythons = sorted({server_python(cfg, a) for a in cfg.arms})
    model = cfg.model.path
    paths = [model] if Path(model).exists() else []  # a hub name is no path to check
    nodes = {s.node_id: s for s in slots}
    refs = {nid: probe.options(scheduling_strategy=on_node(nid)).remote(pythons, paths, os.getcwd()) for nid in nodes}
    out = {}
    for nid, ref in refs.items():
        name = nodes[nid].name.split(".")[0]
        try:
            got = ray.get(ref, timeout=300)
        except ray.exceptions.RayError as exc:
            first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            raise UserError(
                f"node {name} ({nodes[nid].host}) cannot run the harness: {first}; every node "
                "needs this project importable (pip install -e . or the same checkout)"
            ) from None
        if got["missing"]:
            raise UserError(
                f"model.path {got['missing'][0]}: not found on node {name} ({nodes[nid].host}); "
                "every node needs the model at the same path"
            )
        where = f"node {name} ({nodes[nid].host})"
        out[nid] = {
            "name": name,
            "host": nodes[nid].host,
            "hostname": got["host"].get("hostname"),
            "arm_vllm": arm_versions(cfg, got["installations"], where, got["runnable"]),
            "installations": got["installations"],
            "gpu": got["gpu"],
        }
    return out
