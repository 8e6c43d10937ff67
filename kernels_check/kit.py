"""What the run asks of the machine, in one place: vLLM's modules, the device and its timers, and
which kernels exist here. `gpu_kit()` builds it on a GPU (CUDA or ROCm); tests build one of CPU
stand-ins (tests/support/kernel_standins.py), which is how the whole run is tested without a GPU.
Everything else (inputs, paging, the gate patch, op counting, scoring, the store, the report) is the
same code either way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from e2e.gpu.gpu_driver import gpu_driver
from kernels_check import paths, timing

Launch = Callable[[], object]


@dataclass
class Kit:
    v: paths.Vllm
    device: torch.device
    synchronize: Callable[[], None]
    empty_cache: Callable[[], None]
    time_cold: Callable[[Launch, int, torch.Tensor], list[float]]  # (launch, reps, L2 flush buffer) -> ms
    time_graph: Callable[[Launch, int, int], list[float]]  # (launch, launches per graph, replays) -> ms
    rocm_op: Callable[[], tuple[bool, str]]  # is vLLM's ROCm custom op registered here, and why
    fa3: Callable[[], tuple[bool, str]]  # is FA3 usable here, and why
    fa3_varlen: Callable[[], Callable[..., Any]]  # vllm.vllm_flash_attn.flash_attn_varlen_func
    describe: Callable[[], dict[str, Any]]  # the manifest's "gpu" section
    rocm_build: bool  # torch built for ROCm (FA3 is CUDA only)


def _describe(device: torch.device) -> dict[str, Any]:
    p = torch.cuda.get_device_properties(device)
    return {
        "name": torch.cuda.get_device_name(device),
        "capability": list(torch.cuda.get_device_capability(device)),
        "arch": getattr(p, "gcnArchName", None),
        "memory_gib": round(p.total_memory / 2**30, 1),
        "count": torch.cuda.device_count(),
        **gpu_driver(),
    }


def _fa3_varlen() -> Callable[..., Any]:
    from vllm.vllm_flash_attn import flash_attn_varlen_func

    return flash_attn_varlen_func


def gpu_kit() -> Kit:
    """The real machine: vLLM's own modules, CUDA events, the GPU torch sees."""
    v = paths.import_vllm()
    device = torch.device("cuda", torch.cuda.current_device())
    return Kit(
        v=v,
        device=device,
        synchronize=torch.cuda.synchronize,
        empty_cache=torch.cuda.empty_cache,
        time_cold=timing.time_cold,
        time_graph=timing.time_graph,
        rocm_op=paths.rocm_op_registered,
        fa3=paths.fa3_available,
        fa3_varlen=_fa3_varlen,
        describe=lambda: _describe(device),
        rocm_build=torch.version.hip is not None,
    )
