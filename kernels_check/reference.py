"""fp32 reference for pure decode, computed from the dense K/V BEFORE paging.

Reading the reference from the cache would let a paging bug cancel out (the same wrong slot read by
both sides); reading the dense tensors the cache was built from cannot.
"""

from __future__ import annotations

import torch


def reference_decode(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: list[int], scale: float
) -> torch.Tensor:
    """One query token per sequence over its whole context.

    q [seqs, q_heads, head]; k, v [seqs, max_len, kv_heads, head] (only the first seq_lens[s]
    positions of sequence s are used). Query head h attends kv head h // (q_heads // kv_heads),
    as vLLM groups them. Returns float32 [seqs, q_heads, head]. Inputs are upcast exactly (bf16/fp16
    -> fp32), so the reference sees the very numbers the kernels see.
    """
    seqs, q_heads, d = q.shape
    kv_heads = k.shape[2]
    ratio = q_heads // kv_heads
    out = torch.empty(seqs, q_heads, d, dtype=torch.float32, device=q.device)
    for s in range(seqs):
        n = seq_lens[s]
        qs = q[s].float().view(kv_heads, ratio, d)
        ks = k[s, :n].float().permute(1, 0, 2)  # [kv_heads, n, d]
        vs = v[s, :n].float().permute(1, 0, 2)
        scores = torch.matmul(qs, ks.transpose(1, 2)) * scale  # [kv_heads, ratio, n]
        p = torch.softmax(scores, dim=-1)
        out[s] = torch.matmul(p, vs).reshape(q_heads, d)
    return out


def full_fp32_matmul() -> None:
    """No TF32 anywhere: an fp32 reference must be fp32 (PyTorch or vLLM may have enabled TF32)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
