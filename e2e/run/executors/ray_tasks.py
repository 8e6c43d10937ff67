"""The Ray tasks: one server group on its node, a node's versions, and the sweep that leaves no
server behind. Imported only with `--executor ray` (it imports ray).

Every task is scheduled on a named node (NodeAffinitySchedulingStrategy, not soft) and never
retried by Ray itself: the driver decides retries, so that a lost attempt is counted as one.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import psutil

try:
    import ray
except ImportError:  # still importable without the extra (a clean install); create() names the package
    ray = None  # type: ignore[assignment]  # stays importable without the extra

from e2e.run.executors.node_side import NodeProgress, NodeStore, remove, task_files
from e2e.serve import live_servers
from e2e.serve.live_servers import scratch_root


class Task(Protocol):
    """A Ray remote function as the driver calls it: f.options(...).remote(*args) -> an object ref."""

    def options(self, **options: Any) -> Task: ...

    def remote(self, *args: Any, **kwargs: Any) -> Any: ...


def _remote(**options: Any) -> Callable[[Callable[..., Any]], Task]:
    deco: Callable[[Callable[..., Any]], Task] = ray.remote(**options) if ray is not None else (lambda fn: fn)
    return deco


def pin_gpus(environ: Any, gpus: list[int]) -> None:
    """The slot's GPUs for the server. NVIDIA: CUDA_VISIBLE_DEVICES names them. ROCm: Ray has already
    set HIP_VISIBLE_DEVICES (older Ray: ROCR_VISIBLE_DEVICES) for this task, which is kept; a
    CUDA_VISIBLE_DEVICES beside it would index into what those leave (and vLLM's ROCm platform
    refuses one that differs from HIP_VISIBLE_DEVICES), so it goes."""
    if not gpus:
        return
    if environ.get("HIP_VISIBLE_DEVICES") or environ.get("ROCR_VISIBLE_DEVICES"):
        environ.pop("CUDA_VISIBLE_DEVICES", None)
        return
    environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)


@_remote(max_retries=0)
def run_group(job: dict[str, Any], sampler: Any, inbox: Any) -> dict[str, Any]:
    """Start the group's server(s) here and measure its cells with the run loop (e2e/run/runner.py);
    every row goes to the driver's inbox as it is measured, the logs and routing records when the
    group ends. A cancel (the driver's Ctrl-C) arrives as KeyboardInterrupt and unwinds through the
    same teardown as a local Ctrl-C."""
    from e2e.run.runner import Runner
    from e2e.safety.redact import secret_values
    from e2e.serve.launch import server_spec, session_api_key
    from e2e.stats.cells import target_ci_stop_rule

    tid = job["task_dir"]

    def send(event: tuple[Any, ...]) -> None:
        inbox.put((tid, *event))  # returns once the inbox holds it: rows arrive in measured order

    if os.path.isdir(job["cwd"]):
        os.chdir(job["cwd"])  # relative paths in the config mean what they meant on the driver
    pin_gpus(os.environ, job["gpus"])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    live_servers.set_owner(job["harness"])  # its servers are orphans once the driver is gone, not this worker
    send(("hello", os.getpid(), ray.get_runtime_context().get_node_id()))
    cfg, offset = job["cfg"], job["offset"]
    store = NodeStore(job["run_root"], tid, send, offset)
    # Each group draws its prompts from its own stream: the same prompts whatever ran before it.
    sampler.rng = np.random.default_rng([cfg.workload.seed, job["cells"][0].index, offset])
    arm = cfg.arm(job["cells"][0].arm)
    secrets = secret_values(
        {**os.environ, **cfg.server.env, **arm.env}, server_spec(cfg, arm, None).argv(0), [session_api_key()]
    )
    try:
        # A GPU held by another process before a start is not waited for: the driver gives the
        # group another slot (gpu_state.GpuBusy).
        Runner(
            cfg,
            store,
            job["cells"],
            NodeProgress(send, offset),
            sampler,
            stop_rule_factory=target_ci_stop_rule,
            gpu_wait_s=0,
        ).run()
    finally:
        send(("files", task_files(store.task, offset, secrets)))
        remove(store.task)
    return {"pid": os.getpid()}


@_remote(num_cpus=0, max_retries=0)
def probe(pythons: list[str], paths: list[str], cwd: str) -> dict[str, Any]:
    """What this node would run: each interpreter's vLLM/torch versions, GPUs, and which of the
    driver's paths (the model) it lacks."""
    from e2e.gpu import gpu_driver
    from e2e.rundir import manifest as mf

    has_cwd = os.path.isdir(cwd)
    if has_cwd:
        os.chdir(cwd)
    return {
        "host": mf.host(),
        "cwd_exists": has_cwd,
        "gpu": gpu_driver.gpu_driver(),
        "runnable": {py: shutil.which(py) is not None for py in pythons},
        "installations": {py: mf.installation(py) for py in pythons},
        "missing": [p for p in paths if not Path(p).exists()],
    }


@_remote(num_cpus=0, max_retries=0)
def stop_orphans(run_root: str) -> list[dict[str, Any]]:
    """This node's orphans (e2e/serve/live_servers.py): what dead harnesses on this host left, and every
    server of this run (the driver holds its lock: none of them is a live task's yet)."""
    return live_servers.stop_orphans(run_root)


@_remote(num_cpus=0, max_retries=0)
def sweep(
    run_root: str, key: str | None = None, secrets: tuple[str, ...] = (), remove_scratch: bool = False
) -> dict[str, Any]:
    """SIGKILL every process of this user on this node whose environment names this run (one group's, when
    `key` is given). With `key`, also hand back what a lost task of that group left in scratch, its
    logs scrubbed of `secrets` and of the API keys the killed servers held (their teardown, which
    scrubs a log, never ran)."""
    mine, keys = [], set()
    for p in psutil.process_iter(["pid", "uids"]):
        if p.info["uids"] is None or p.info["uids"].real != os.getuid():
            continue  # another user's environment never names what we kill
        try:
            env = p.environ()
        except (psutil.Error, OSError):
            continue
        if live_servers.of_run(env, run_root, key):  # the whole folder, never a prefix of another's
            mine.append(p)
            keys.add(env.get("VLLM_API_KEY", ""))
    for p in mine:
        try:
            p.kill()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(mine, timeout=10)
    files: dict[str, bytes] = {}
    scratch = scratch_root(run_root)
    if key is not None:
        hidden = frozenset(s for s in (*secrets, *keys) if len(s) >= 6)
        for task in sorted((scratch / "tasks").glob(f"{key}.o*")):
            _, offset, _ = task.name.rsplit(".", 2)
            files.update(task_files(task, int(offset[1:]), hidden))
            remove(task)
    if remove_scratch:
        remove(scratch)
    return {"killed": sorted(p.pid for p in mine), "left": sorted(p.pid for p in alive), "files": files}
