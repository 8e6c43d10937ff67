"""CPU stand-ins for the kernels kernels_check drives, because no GPU is here: torch code standing in
for vLLM 0.26.0's paged-decode dispatch (chunked_prefill_paged_decode: prefill branch, gate lookup,
then the ROCm custom op or the Triton kernel), its Triton kernel_paged_attention_2d, the ROCm custom
op and FA3, each reading the cache layout the real one reads through the same block table; and a
module standing in for vllm.platforms.rocm (the real one cannot import on a CPU build). `cpu_kit()`
makes a kernels_check Kit of them, so the whole run (routing probes, cells, faults, controls, the
store, the report) runs in CI. They say nothing about vLLM's kernels: the GPU run does that.
"""

from __future__ import annotations

import functools
import inspect
import math
import sys
import time
import types
from typing import Any

import torch

from e2e.plugin import patches
from kernels_check import paths
from kernels_check.kit import Kit


def read_rocm(q, key_cache, value_cache, block_table, seq_lens, scale, load_mask=True):
    """Decode from the ROCm-layout cache, whole blocks at a time, like kernel_paged_attention_2d. Without
    the K/V load mask, an unwritten slot's NaN in V reaches the output (0 * NaN): vllm#53856's defect."""
    seqs, qh, d = q.shape
    _, kvh, _, bs, _ = key_cache.shape
    out = torch.empty(seqs, qh, d, dtype=torch.float32)
    for s in range(seqs):
        n = int(seq_lens[s])
        nb = math.ceil(n / bs)
        p = block_table[s, :nb].long()
        kk = key_cache[p].permute(0, 3, 1, 2, 4).reshape(nb * bs, kvh, d).float()
        vv = value_cache[p].permute(0, 3, 1, 2).reshape(nb * bs, kvh, d).float()
        if load_mask:
            kk[n:] = 0.0
            vv[n:] = 0.0
        for h in range(qh):
            g = h // (qh // kvh)
            sc = (kk[:, g] @ q[s, h].float()) * scale
            sc = torch.where(torch.arange(nb * bs) < n, sc, -math.inf)  # the score mask
            out[s, h] = torch.softmax(sc, dim=0) @ vv[:, g]
    return out.to(q.dtype)


def read_fa(q, key_cache, value_cache, block_table, seq_lens, scale):
    """Decode from the FLASH_ATTN-layout cache [N, block, kv_heads, head], masked, like FA3."""
    seqs, qh, d = q.shape
    bs, kvh = key_cache.shape[1], key_cache.shape[2]
    out = torch.empty(seqs, qh, d, dtype=torch.float32)
    for s in range(seqs):
        n = int(seq_lens[s])
        p = block_table[s, : math.ceil(n / bs)].long()
        kk = key_cache[p].reshape(-1, kvh, d)[:n].float()
        vv = value_cache[p].reshape(-1, kvh, d)[:n].float()
        for h in range(qh):
            g = h // (qh // kvh)
            out[s, h] = torch.softmax((kk[:, g] @ q[s, h].float()) * scale, dim=0) @ vv[:, g]
    return out.to(q.dtype)


class Triton2d:
    """Stands in for kernel_paged_attention_2d, launched as kernel[grid](**kwargs) with 0.26.0's names."""

    def __getitem__(self, grid):
        def launch(**kw):
            out = read_rocm(
                kw["query_ptr"],
                kw["key_cache_ptr"],
                kw["value_cache_ptr"],
                kw["block_tables_ptr"],
                kw["seq_lens_ptr"].tolist(),
                kw["scale"],
            )
            kw["output_ptr"].copy_(out)

        return launch


def _custom_op(mode: str, load_mask: bool):
    """vllm._custom_ops.paged_attention_rocm as 0.26.0's dispatch calls it. mode: "ok" (runs), "none"
    (not registered: what an NVIDIA machine raises), "no-code" (registered, no code for this GPU)."""

    def paged_attention_rocm(output, exp_sums, max_logits, tmp_out, query, key_cache, value_cache, num_kv_heads, **kw):
        if mode == "none":
            raise AttributeError("'_OpNamespace' '_rocm_C' object has no attribute 'paged_attention'")
        if mode == "no-code":
            raise RuntimeError("HIP error: invalid device function\nCompile with TORCH_USE_HIP_DSA")
        out = read_rocm(
            query, key_cache, value_cache, kw["block_tables"], kw["seq_lens"].tolist(), kw["scale"], load_mask
        )
        output.copy_(out)

    return paged_attention_rocm


def _dispatch(custom_ops: types.ModuleType) -> types.ModuleType:
    """chunked_prefill_paged_decode's routing, as in 0.26.0: prefill branch, the gate looked up in
    vllm.platforms.rocm on every call, then the custom op or the Triton kernel (module attributes read
    at call time, so kernels_check's op counter sees them)."""
    mod = types.ModuleType("standin_chunked_prefill_paged_decode")

    def chunked_prefill_paged_decode(
        query,
        key,
        value,
        output,
        kv_cache_dtype,
        key_cache,
        value_cache,
        block_table,
        query_start_loc,
        seq_lens,
        max_seq_len,
        max_query_len,
        k_scale,
        v_scale,
        alibi_slopes=None,
        sliding_window=None,
        sm_scale=None,
        output_scale=None,
        sinks=None,
        is_block_table_ptr=False,
        causal=True,
    ):
        if max_query_len > 1:
            return mod.context_attention_fwd(q=query)
        num_kv_heads, head_size, block_size = key.shape[1], query.shape[2], value_cache.shape[3]
        gate = sys.modules[patches.GATE_MODULE].use_rocm_custom_paged_attention
        ratio = query.shape[1] // num_kv_heads
        if gate(query.dtype, head_size, block_size, ratio, max_seq_len, 0, kv_cache_dtype, alibi_slopes, sinks):
            custom_ops.paged_attention_rocm(
                output,
                None,
                None,
                None,
                query,
                key_cache,
                value_cache,
                num_kv_heads,
                scale=sm_scale,
                block_tables=block_table,
                seq_lens=seq_lens,
                query_start_loc=query_start_loc,
                block_size=block_size,
                max_seq_len=max_seq_len,
            )
        else:
            mod.kernel_paged_attention_2d[(query.shape[0], num_kv_heads)](
                output_ptr=output,
                query_ptr=query,
                key_cache_ptr=key_cache,
                value_cache_ptr=value_cache,
                block_tables_ptr=block_table,
                seq_lens_ptr=seq_lens,
                scale=sm_scale,
            )

    def context_attention_fwd(**kw):
        raise AssertionError("pure decode never reaches the prefill kernel")

    mod.chunked_prefill_paged_decode = chunked_prefill_paged_decode
    mod.kernel_paged_attention_2d = Triton2d()
    mod.context_attention_fwd = context_attention_fwd
    return mod


def gate_module() -> types.ModuleType:
    """Stands in for vllm.platforms.rocm: the gate alone, answering as gfx11 does (ratio >= 3)."""
    fake = types.ModuleType(patches.GATE_MODULE)
    fake.__spec__ = types.SimpleNamespace(name=patches.GATE_MODULE)

    @functools.cache
    def use_rocm_custom_paged_attention(
        qtype,
        head_size,
        block_size,
        gqa_ratio,
        max_seq_len,
        sliding_window,
        kv_cache_dtype,
        alibi_slopes=None,
        sinks=None,
    ):
        return gqa_ratio >= 3

    fake.use_rocm_custom_paged_attention = use_rocm_custom_paged_attention
    return fake


def fa3_varlen(
    q, k, v, out, cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k, softmax_scale, causal, block_table, fa_version
):
    """Stands in for vllm.vllm_flash_attn.flash_attn_varlen_func, called as kernels_check calls it."""
    assert fa_version == 3 and causal and max_seqlen_q == 1
    out.copy_(read_fa(q, k, v, block_table, seqused_k.tolist(), softmax_scale))


def _time(launch, n: int) -> list[float]:
    ms = []
    for _ in range(n):
        t0 = time.perf_counter()
        launch()
        ms.append((time.perf_counter() - t0) * 1e3)
    return ms


def cpu_kit(rocm: str = "none", fa3: bool = True, rocm_load_mask: bool = True) -> Kit:
    """A Kit of the stand-ins on the CPU. rocm: "none" (an NVIDIA machine: the op is not registered),
    "ok" (a ROCm build whose custom op runs; rocm_load_mask=False gives it vllm#53856's defect),
    "no-code" (registered, but the build has no code for this GPU: every launch raises)."""
    custom_ops = types.ModuleType("standin_custom_ops")
    custom_ops.paged_attention_rocm = _custom_op(rocm, rocm_load_mask)
    dispatch = _dispatch(custom_ops)
    v = paths.Vllm(
        version="stand-in",
        dispatch_mod=dispatch,
        custom_ops=custom_ops,
        rocm=sys.modules[patches.GATE_MODULE],
        dispatch_signature=str(inspect.signature(dispatch.chunked_prefill_paged_decode)),
    )
    registered = rocm != "none"
    return Kit(
        v=v,
        device=torch.device("cpu"),
        synchronize=lambda: None,
        empty_cache=lambda: None,
        time_cold=lambda launch, reps, flush: _time(launch, reps),
        time_graph=lambda launch, inner, reps: [
            t / inner for t in _time(lambda: [launch() for _ in range(inner)], reps)
        ],
        rocm_op=lambda: (registered, "stand-in op registered" if registered else "stand-in: no ROCm op here"),
        fa3=lambda: (fa3, "stand-in FA3 (torch on the CPU)" if fa3 else "stand-in: no FA3"),
        fa3_varlen=lambda: fa3_varlen,
        describe=lambda: {"name": "CPU stand-in (no GPU)", "arch": "gfx1100" if registered else None},
        rocm_build=registered,
    )


def install_gate(monkeypatch: Any) -> types.ModuleType:
    """The stand-in gate module in sys.modules and a fresh gate state for the patch mechanism (restored
    by monkeypatch): the run forces the gate through e2e.plugin.patches, unchanged."""
    fake = gate_module()
    monkeypatch.setitem(sys.modules, patches.GATE_MODULE, fake)
    monkeypatch.setattr(patches, "GATE", patches._Gate())
    monkeypatch.setattr(patches, "APPLIED", {})
    return fake
