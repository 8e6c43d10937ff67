"""Fault injection: what goes where, and the bookkeeping that says which slots hold it.

Tail faults (the question of vllm#53856): the whole cache is filled with the fault value in K only,
V only, or K and V, then the sequences are written. What keeps the fault value afterwards is the
unwritten tail of each sequence's final block (seq_len % block slots short of a full block: none at
4096, six at 4090 with block 16) plus the blocks no sequence owns. A correct kernel never reads
either, so its output must be unchanged.

Controls (so that a clean sweep means something): the same values written into a slot the kernel
MUST read (the last written token of sequence 0, kv head 0). A working instrument flags every
control; the report counts how many it saw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kernels_check.paging import token_slots

MODES = ("none", "k", "v", "kv")
VALUES = {"nan": math.nan, "large": 1.0e4}  # 1e4 fits fp16 (max 65504) and bf16
CONTROLS = (("k", "nan"), ("v", "nan"), ("k", "large"), ("v", "large"))


def fills(mode: str, value: str) -> tuple[float, float]:
    """(fill_k, fill_v) for a cache whose unwritten slots carry the fault in `mode`; the other cache
    is zero, as vLLM's allocate_kv_cache leaves it."""
    if mode not in MODES:
        raise ValueError(f"fault mode {mode!r} not in {MODES}")
    x = VALUES[value]
    return (x if mode in ("k", "kv") else 0.0, x if mode in ("v", "kv") else 0.0)


def tail_slots(seq_len: int, block_size: int) -> int:
    """Unwritten slots at the end of the final block of a sequence of seq_len tokens."""
    return (-seq_len) % block_size


def written_mask(seq_lens: list[int], block_table: torch.Tensor, num_blocks: int, block_size: int) -> torch.Tensor:
    """bool [num_blocks, block_size]: True where some sequence wrote a token. Everything else keeps
    the cache's fill value (the fault, when one is injected)."""
    m = torch.zeros(num_blocks, block_size, dtype=torch.bool)
    _, _, p, o = token_slots(seq_lens, block_table, block_size)
    m[p, o] = True
    return m


@dataclass(frozen=True)
class TailBookkeeping:
    tail_slots_per_seq: list[int]  # unwritten slots inside each sequence's final block
    poisoned_in_table: int  # fault-holding slots inside blocks that some table names
    poisoned_outside_table: int  # fault-holding slots in blocks nobody owns (incl. block 0)


def tail_bookkeeping(
    seq_lens: list[int], block_table: torch.Tensor, num_blocks: int, block_size: int
) -> TailBookkeeping:
    written = written_mask(seq_lens, block_table, num_blocks, block_size)
    owned = torch.zeros(num_blocks, dtype=torch.bool)
    for s, n in enumerate(seq_lens):
        nb = math.ceil(n / block_size)
        owned[block_table[s, :nb].long()] = True
    poisoned = ~written
    return TailBookkeeping(
        [tail_slots(n, block_size) for n in seq_lens], int(poisoned[owned].sum()), int(poisoned[~owned].sum())
    )


def control_vector(which: str, value: str, q_row: torch.Tensor) -> torch.Tensor:
    """The [head] vector a control writes. NaN: all NaN. Large in V: all 1e4. Large in K: 1e4
    aligned with the query's signs, so the poisoned token dominates the softmax (a large key with
    random signs could just as well vanish from it)."""
    d = q_row.shape[-1]
    if value == "nan":
        return torch.full((d,), math.nan, dtype=q_row.dtype, device=q_row.device)
    if which == "v":
        return torch.full((d,), VALUES["large"], dtype=q_row.dtype, device=q_row.device)
    sign = torch.where(q_row >= 0, 1.0, -1.0).to(q_row.dtype)
    return sign * (VALUES["large"] / math.sqrt(d))


def inject_written(
    layout: str,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq: int,
    token: int,
    kv_head: int,
    which: str,
    vec: torch.Tensor,
) -> None:
    """Overwrite one written token's K or V (one kv head) in place, in either cache layout."""
    block_size = value_cache.shape[3] if layout == "rocm" else key_cache.shape[1]
    p = int(block_table[seq, token // block_size])
    o = token % block_size
    if layout == "rocm":
        if which == "k":  # [N, H, D/x, B, x]
            x = key_cache.shape[4]
            key_cache[p, kv_head, :, o, :] = vec.view(-1, x)
        else:  # [N, H, D, B]
            value_cache[p, kv_head, :, o] = vec
    elif layout == "fa":  # [N, B, H, D]
        (key_cache if which == "k" else value_cache)[p, o, kv_head, :] = vec
    else:
        raise ValueError(f"layout {layout!r} not in ('rocm', 'fa')")
