"""The run's manifest.json at its start: the resolved config (redacted), each arm's server argv,
environment and installation, host, GPU and its measured read bandwidth, and the code that ran.
Built once by the session (a new run, or gsm8k's own folder); the format is e2e/rundir/formats.py's."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from e2e.design.config import Config, config_to_dict, harness_flag_overrides
from e2e.design.plan import Cell
from e2e.gpu import gpu_driver
from e2e.run import profiling
from e2e.rundir import identity
from e2e.rundir import manifest as mf
from e2e.rundir.formats import VERSIONS, now
from e2e.rundir.manifest_model import config_hash
from e2e.safety.redact import redact_args, redact_config, redact_env
from e2e.serve import profiler_args as server_args
from e2e.serve.launch import server_python, server_spec
from e2e.twin.stamp import read_stamp


def build_manifest(cfg: Config, run_id: str, cells: list[Cell]) -> dict[str, Any]:
    config = redact_config(config_to_dict(cfg))
    pythons = {a.name: server_python(cfg, a) for a in cfg.arms}
    installs = {p: mf.installation(p) for p in sorted(set(pythons.values()))}
    gpu = gpu_driver.gpu_driver()
    arm_info = {}
    for a in cfg.arms:
        spec = server_spec(cfg, a, Path("<cell-dir>"))
        if profiling.wanted(cfg, a) and not server_args.configured_by_user(spec):  # as its servers start
            spec = server_args.with_profiler(spec, Path("<cell-dir>/profile-a<n>"), server_args.release_of(spec.python))
        arm_info[a.name] = {
            "server_argv": redact_args(spec.argv(0)),
            "api_key": "random per harness process, passed as VLLM_API_KEY (never in argv or logs)",
            "env": redact_env(spec.env),
            "patches": list(a.patches),
            "installation": installs[pythons[a.name]],
        }
    config = redact_config(config_to_dict(cfg))
    return {
        "schema_version": VERSIONS["manifest"],
        "run_id": run_id,
        "tool": "vllm-e2e-bench",
        "started": now(),
        "ended": None,
        "status": "running",
        "exit_status": None,
        "config": config,
        "config_sha256": config_hash(config),
        "n_cells": len(cells),  # resume checks the hash
        "server_mode": cfg.server.mode,
        # Set only with server.allow_harness_flag_overrides: which args override the harness's own.
        **(
            {"harness_flag_overrides": [f"{w}: {arg} (sets {flag})" for w, arg, flag in harness_flag_overrides(cfg)]}
            if cfg.server.allow_harness_flag_overrides
            else {}
        ),
        "model": {"path": cfg.model.path, "twin_of": cfg.model.twin_of, "twin_stamp": read_stamp(Path(cfg.model.path))},
        "arms": arm_info,
        "host": mf.host(),
        "gpu": gpu,
        "gpu_bandwidth": _gpu_bandwidth(
            cfg, gpu, pythons[cfg.arms[0].name], installs[pythons[cfg.arms[0].name]].get("gpus")
        ),
        "git": mf.git_commit(mf.project_root()),
        # what ran, by content too: a copy with a stale or no .git is still identified (e2e/rundir/identity.py)
        "code": identity.identify(mf.project_root(), config),
        "environment": mf.relevant_env(),
        "resumes": [],
    }


def _gpu_bandwidth(cfg: Config, gpu: dict[str, Any], python: str, torch_gpus: list[str] | None) -> dict[str, Any]:
    """The read bandwidth this run's GPU reaches, measured once before any server holds it (the
    roofline's second floor). Any GPU torch drives (NVIDIA, or AMD through HIP: torch calls it "cuda");
    skipped where neither nvidia-smi, amdsmi nor the arm's torch sees one, or stats.measure_bandwidth is off."""
    if not cfg.stats.measure_bandwidth:
        return {"available": False, "reason": "stats.measure_bandwidth = false"}
    if not (gpu.get("nvidia_smi") or (gpu.get("amd") or {}).get("gpus") or torch_gpus):
        return {"available": False, "reason": "no GPU (nvidia-smi, amdsmi and the arm's torch found none)"}
    from e2e.gpu import bandwidth

    env = {**os.environ, **cfg.server.env}
    return bandwidth.measure(python, "cuda", env=env)
