"""Which GPUs this machine has and their driver, for a run's manifest and the dry run's prior: nvidia-smi's
list, else AMD's (amdsmi, amd-smi; e2e/gpu/gpu_amd.py). Bounded: a wedged driver never holds a run."""

from __future__ import annotations

import os
from typing import Any

from e2e.safety.bounded_run import run_text

SMI_DEADLINE_S = 30.0  # nvidia-smi answers in well under a second; a wedged driver never does
SMI_MAX_BYTES = 1 << 20  # a line per GPU: a few hundred bytes


def gpu_driver() -> dict[str, Any]:
    """The GPUs nvidia-smi lists, with their driver: {} without nvidia-smi; {"nvidia_smi_error": why}
    when it fails, hangs, floods or prints what is not its CSV (bounded: e2e/safety/bounded_run.py)."""
    argv = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    try:
        out = run_text(argv, SMI_DEADLINE_S, SMI_MAX_BYTES)
    except FileNotFoundError:
        return amd_driver()
    except (OSError, RuntimeError) as exc:
        return {"nvidia_smi_error": str(exc)[:200]}
    try:
        rows = [[x.strip() for x in line.split(",")] for line in out.strip().splitlines()]
        return {"nvidia_smi": [{"name": a, "driver": b, "memory": c} for a, b, c in rows]}
    except ValueError:
        return {"nvidia_smi_error": f"not the CSV asked for: {out.strip()[:200]!r}"}


def amd_driver() -> dict[str, Any]:
    """Without nvidia-smi: AMD's GPUs, driver, VRAM, gfx arch and ROCm version (e2e/gpu/gpu_amd.py),
    as {"amd": {...}}; {} where there is nothing AMD to read."""
    from e2e.gpu import gpu_amd
    from e2e.gpu.gpu_probe import within

    got = gpu_amd.provenance(os.environ, SMI_DEADLINE_S, within)
    return {"amd": got} if got else {}
