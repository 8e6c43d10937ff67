"""The bytes of each tensor, made with plain numpy so they are the same on every machine.

- one PCG64 stream per tensor, seeded by (seed, crc32(name)): same seed -> byte-identical shards,
  independent of shard size or tensor order;
- int4 weights: random 32-bit words, i.e. eight uniform nibbles each (q in [-8, 7] after the
  compressed-tensors offset of 8); nothing is ever quantized;
- floats are written as bf16 bit patterns with a random sign and mantissa and one fixed exponent
  chosen per tensor, so each linear roughly preserves RMS (within a factor sqrt(2)): the group scales
  are ~ 1/sqrt(21.5 * in_features) (21.5 = E[q^2]), other matrices ~ 1/sqrt(fan_in);
- norm weights: whatever makes the norm a plain normalisation (zeros for Gemma's (1 + w) RMSNorm,
  ones for LayerNorm and w-scaled RMSNorms); biases zero.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator

import numpy as np

from e2e.twin.tensors import TensorSpec

CHUNK_BYTES = 32 << 20  # generation/write unit; fixed, so it cannot change the bytes


def pack_int4(q: np.ndarray) -> np.ndarray:
    """int8 values in [-8, 7], shape [rows, K] -> int32 [rows, K/8]; element j of a word sits in bits
    4j..4j+3 as q + 8 (compressed-tensors `pack_to_int32`, packed_dim=1; vLLM's uint4b8 type)."""
    if q.ndim != 2 or q.shape[1] % 8:
        raise ValueError("pack_int4 needs a 2-D array whose last dimension is a multiple of 8")
    u = (q.astype(np.int16) + 8).astype(np.uint32).reshape(q.shape[0], -1, 8)
    words = np.zeros(u.shape[:2], dtype=np.uint32)
    for j in range(8):
        words |= u[:, :, j] << np.uint32(4 * j)
    return words.view(np.int32)


def unpack_int4(packed: np.ndarray) -> np.ndarray:
    """Inverse of pack_int4: int32 [rows, K/8] -> int8 [rows, K] in [-8, 7]."""
    w = packed.view(np.uint32)
    parts = [((w >> np.uint32(4 * j)) & np.uint32(0xF)).astype(np.int16) - 8 for j in range(8)]
    return np.stack(parts, axis=-1).reshape(packed.shape[0], -1).astype(np.int8)


def bf16_to_float(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


# -- values ----------------------------------------------------------------------------------------
def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, zlib.crc32(name.encode())])))


def _bf16_exponent(rms: float) -> int:
    # |x| uniform-ish in [2^e, 2^(e+1)) has mean square (7/3) 4^e.
    e = round(math.log2(rms / math.sqrt(7.0 / 3.0)))
    return min(max(e + 127, 1), 254)


def tensor_chunks(spec: TensorSpec, seed: int) -> Iterator[memoryview]:
    """The tensor's bytes (little endian, row-major) in chunks of at most CHUNK_BYTES."""
    if spec.fill == "shape":
        yield memoryview(np.asarray(spec.value, dtype="<i8").tobytes())
        return
    if spec.fill in ("zeros", "ones"):
        yield np.full(spec.shape, 0x3F80 if spec.fill == "ones" else 0, dtype="<u2").data.cast("B")
        return
    rng = _rng(seed, spec.name)
    if spec.fill != "packed":
        keep = np.uint16(0x007F if spec.fill == "scale" else 0x807F)  # scales stay positive
        exp = np.uint16(_bf16_exponent(spec.rms) << 7)
    left = spec.nbytes
    while left:
        n = min(left, CHUNK_BYTES)
        raw = rng.bit_generator.random_raw((n + 7) // 8)  # PCG64 output is the same on every machine
        if spec.fill != "packed":  # every 32-bit word of raw bits is already eight uniform nibbles
            bits = raw.view("<u2")
            bits &= keep
            bits |= exp
        yield raw.data.cast("B")[:n]
        left -= n
