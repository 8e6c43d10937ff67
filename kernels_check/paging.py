"""Page dense K/V into vLLM's KV-cache layouts and read them back (pure torch; runs on CPU too).

Layouts, as vLLM 0.26.0 allocates and views them:
- ROCM_ATTN / chunked_prefill_paged_decode: one tensor [2, num_blocks, block, kv_heads, head]
  (RocmAttentionBackend.get_kv_cache_shape), split by RocmAttentionImpl.forward
  (vllm/v1/attention/ops/paged_attn.py::split_kv_cache) into
  key_cache [num_blocks, kv_heads, head // x, block, x] (x = 16 // element size) and
  value_cache [num_blocks, kv_heads, head, block].
- FLASH_ATTN (vllm/v1/attention/backends/flash_attn.py): one tensor stored [num_blocks, block,
  kv_heads, 2 * head] and split on the last dim into key/value [num_blocks, block, kv_heads, head].
Physical block 0 is never handed out (vLLM's null block); block tables are padded with 0.
Slots not written by a sequence keep the cache's fill value: that is where faults are injected.
"""

from __future__ import annotations

import math

import torch


def blocks_needed(seq_len: int, block_size: int) -> int:
    return math.ceil(seq_len / block_size)


def make_block_table(
    seq_lens: list[int], block_size: int, spare_blocks: int = 4, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, int]:
    """A block table int32 [seqs, max_blocks] over a random permutation of physical blocks 1..N-1,
    so that logical order and physical order never agree (a paging bug cannot hide behind identity
    mapping). Returns (block_table on CPU, num_blocks including block 0 and the spares)."""
    need = [blocks_needed(n, block_size) for n in seq_lens]
    num_blocks = 1 + sum(need) + spare_blocks
    perm = torch.randperm(num_blocks - 1, generator=generator) + 1
    table = torch.zeros(len(seq_lens), max(need), dtype=torch.int32)
    at = 0
    for s, nb in enumerate(need):
        table[s, :nb] = perm[at : at + nb].to(torch.int32)
        at += nb
    return table, num_blocks


def token_slots(
    seq_lens: list[int], block_table: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """For every written token: (seq index, token index, physical block, offset in block), long."""
    seqs = torch.cat([torch.full((n,), s, dtype=torch.long) for s, n in enumerate(seq_lens)])
    toks = torch.cat([torch.arange(n, dtype=torch.long) for n in seq_lens])
    bt = block_table.to(device="cpu", dtype=torch.long)
    phys = bt[seqs, toks // block_size]
    return seqs, toks, phys, toks % block_size


def kv_x(dtype: torch.dtype) -> int:
    """vLLM's x: how many elements make 16 bytes (the key cache's innermost dim)."""
    return 16 // torch.empty((), dtype=dtype).element_size()


def rocm_views(kv: torch.Tensor, kv_heads: int, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same views as vLLM's PagedAttention.split_kv_cache on a [2, N, ...] cache tensor."""
    x = kv_x(kv.dtype)
    n = kv.shape[1]
    key_cache = kv[0].view(n, kv_heads, head_size // x, -1, x)
    value_cache = kv[1].view(n, kv_heads, head_size, -1)
    return key_cache, value_cache


def alloc_rocm(
    num_blocks: int,
    block_size: int,
    kv_heads: int,
    head_size: int,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    fill_k: float = 0.0,
    fill_v: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    kv = torch.empty(2, num_blocks, block_size * kv_heads * head_size, dtype=dtype, device=device)
    kv[0].fill_(fill_k)
    kv[1].fill_(fill_v)
    return rocm_views(kv, kv_heads, head_size)


def _rocm_slot_views(key_cache: torch.Tensor, value_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # Index by (physical block, offset) first: key [N, B, H, D/x, x], value [N, B, H, D]. These are
    # permuted views of the cache storage, so indexed assignment writes into the cache itself.
    return key_cache.permute(0, 3, 1, 2, 4), value_cache.permute(0, 3, 1, 2)


def page_rocm(
    k: torch.Tensor,
    v: torch.Tensor,
    seq_lens: list[int],
    block_table: torch.Tensor,
    num_blocks: int,
    block_size: int,
    fill_k: float = 0.0,
    fill_v: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense k, v [seqs, max_len, kv_heads, head] -> (key_cache, value_cache) in the ROCm layout,
    every unwritten slot holding fill_k / fill_v."""
    h, d = k.shape[2], k.shape[3]
    key_cache, value_cache = alloc_rocm(num_blocks, block_size, h, d, k.dtype, k.device, fill_k, fill_v)
    write_rocm(key_cache, value_cache, k, v, seq_lens, block_table)
    return key_cache, value_cache


def write_rocm(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seq_lens: list[int],
    block_table: torch.Tensor,
) -> None:
    """Write every token < seq_len of each sequence into its slot; nothing else is touched."""
    block_size = value_cache.shape[3]
    x = key_cache.shape[4]
    s, t, p, o = (a.to(k.device) for a in token_slots(seq_lens, block_table, block_size))
    k5, v4 = _rocm_slot_views(key_cache, value_cache)
    h, d = k.shape[2], k.shape[3]
    k5[p, o] = k[s, t].view(-1, h, d // x, x)
    v4[p, o] = v[s, t]


def unpage_rocm(
    key_cache: torch.Tensor, value_cache: torch.Tensor, seq_lens: list[int], block_table: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Read back dense k, v [seqs, max_len, kv_heads, head]; positions >= seq_len are zero."""
    block_size = value_cache.shape[3]
    _, h, _, _, _ = key_cache.shape
    d = value_cache.shape[2]
    s, t, p, o = (a.to(key_cache.device) for a in token_slots(seq_lens, block_table, block_size))
    k5, v4 = _rocm_slot_views(key_cache, value_cache)
    shape = (len(seq_lens), max(seq_lens), h, d)
    k = torch.zeros(shape, dtype=key_cache.dtype, device=key_cache.device)
    v = torch.zeros_like(k)
    k[s, t] = k5[p, o].reshape(-1, h, d)
    v[s, t] = v4[p, o]
    return k, v


def alloc_fa(
    num_blocks: int,
    block_size: int,
    kv_heads: int,
    head_size: int,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    fill_k: float = 0.0,
    fill_v: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM 0.26.0 FLASH_ATTN storage: [N, block, kv_heads, 2*head], K and V split on the last dim."""
    kv = torch.empty(num_blocks, block_size, kv_heads, 2 * head_size, dtype=dtype, device=device)
    key_cache, value_cache = kv.split(head_size, dim=-1)
    key_cache.fill_(fill_k)
    value_cache.fill_(fill_v)
    return key_cache, value_cache


def write_fa(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seq_lens: list[int],
    block_table: torch.Tensor,
) -> None:
    block_size = key_cache.shape[1]
    s, t, p, o = (a.to(k.device) for a in token_slots(seq_lens, block_table, block_size))
    key_cache[p, o] = k[s, t]
    value_cache[p, o] = v[s, t]


def unpage_fa(
    key_cache: torch.Tensor, value_cache: torch.Tensor, seq_lens: list[int], block_table: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    block_size, h, d = key_cache.shape[1:]
    s, t, p, o = (a.to(key_cache.device) for a in token_slots(seq_lens, block_table, block_size))
    shape = (len(seq_lens), max(seq_lens), h, d)
    k = torch.zeros(shape, dtype=key_cache.dtype, device=key_cache.device)
    v = torch.zeros_like(k)
    k[s, t] = key_cache[p, o]
    v[s, t] = value_cache[p, o]
    return k, v


def page_fa(
    k: torch.Tensor,
    v: torch.Tensor,
    seq_lens: list[int],
    block_table: torch.Tensor,
    num_blocks: int,
    block_size: int,
    fill_k: float = 0.0,
    fill_v: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense k, v -> (key_cache, value_cache) in vLLM's FLASH_ATTN layout."""
    h, d = k.shape[2], k.shape[3]
    key_cache, value_cache = alloc_fa(num_blocks, block_size, h, d, k.dtype, k.device, fill_k, fill_v)
    write_fa(key_cache, value_cache, k, v, seq_lens, block_table)
    return key_cache, value_cache
