"""The one table that puts a kernel (or, on the CPU lane, a CPU op) into a group of the decode step.

First match wins, case-insensitive, on the kernel's name as the trace records it. Attention comes
before GEMM: FlashAttention's and the paged-attention kernels' names hold "gemm"-like words in some
builds. Everything unmatched is "other" (samplers, copies, the embedding gather)."""

from __future__ import annotations

import re

GROUPS = ("attention", "gemm", "norm/elementwise", "communication", "other")

# (group, pattern): the first that matches a kernel's name decides its group.
PATTERNS: tuple[tuple[str, str], ...] = (
    # FA2/FA3 (flash_fwd*, FlashAttn*), vLLM's Triton backends (kernel_unified_attention*,
    # kernel_paged_attention_2d, _fwd_kernel), ROCm's paged_attention_*, FlashInfer, CPU attention ops,
    # and the KV-cache writes each attention layer makes (reshape_and_cache*, unified_kv_cache_update)
    ("attention", r"flash|attn|attention|_fwd_kernel|mha|sdpa|reshape_and_cache|kv_cache"),
    # cuBLAS/CUTLASS/Machete/Marlin GEMMs, Triton matmuls, CPU linear/matmul ops
    ("gemm", r"gemm|gemv|machete|marlin|cutlass|cublas|matmul|onednn|_mm\b|\bmm\b|addmm|linear|bmm|sm90_xmma|nvjet"),
    ("communication", r"nccl|all_?reduce|all_?gather|reduce_scatter|cross_device|custom_ar|allreduce"),
    # RMSNorm/LayerNorm, rotary, activations and the elementwise glue between them
    (
        "norm/elementwise",
        r"norm|rotary|rope|gelu|silu|act_and_mul|elementwise|vectorized|unrolled|aten::(add|mul|sub|div|"
        r"pow|rsqrt|tanh|neg|cat|copy|to|where|mean|exp|sum)_?\b|triton_poi|triton_per|triton_red",
    ),
)
_COMPILED = tuple((g, re.compile(p, re.IGNORECASE)) for g, p in PATTERNS)


def group_of(name: str) -> str:
    """The group of a kernel or CPU op name (GROUPS)."""
    for group, pattern in _COMPILED:
        if pattern.search(name):
            return group
    return "other"
