"""Kernel-level check of vLLM's paged-attention decode paths: routing and numerical error.

Drives vLLM's own `chunked_prefill_paged_decode` dispatch with only the ROCm custom-kernel gate
forced on or off (through e2e.plugin.patches), scores each path against an fp32 reference computed
from the K/V tensors before paging, times the paths, and injects faults into the unwritten tail of
the final KV block. GPU required; `python -m kernels_check --help`.
"""
