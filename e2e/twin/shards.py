"""safetensors shards written tensor by tensor in bounded chunks (no model in memory), hashed as
they are written; the digests go into the stamp."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from e2e.twin.tensors import DTYPES, TensorSpec
from e2e.twin.values import tensor_chunks

DEFAULT_SHARD_GB = 4.5


def _safetensors_header(specs: list[TensorSpec]) -> bytes:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    off = 0
    for s in specs:
        header[s.name] = {"dtype": s.dtype, "shape": list(s.shape), "data_offsets": [off, off + s.nbytes]}
        off += s.nbytes
    js = json.dumps(header, separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)  # data starts 8-aligned, as safetensors writes it
    return struct.pack("<Q", len(js)) + js


def split_shards(specs: list[TensorSpec], shard_bytes: int) -> list[list[TensorSpec]]:
    """Consecutive tensors up to shard_bytes per shard; inside a shard widest dtype first (alignment)."""
    shards: list[list[TensorSpec]] = [[]]
    size = 0
    for s in specs:
        if shards[-1] and size + s.nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(s)
        size += s.nbytes
    return [sorted(sh, key=lambda s: (-DTYPES[s.dtype][0], s.name)) for sh in shards]


def _write_shard(path: Path, shard: list[TensorSpec], seed: int) -> str:
    h = hashlib.sha256()
    with open(path, "wb") as f:
        blocks: Iterator[bytes | memoryview] = itertools.chain(
            [_safetensors_header(shard)], (c for s in shard for c in tensor_chunks(s, seed))
        )
        for block in blocks:  # a generator: one chunk per thread in memory at a time
            h.update(block)
            f.write(block)
    return h.hexdigest()


def write_shards(
    specs: list[TensorSpec], folder: Path, seed: int, shard_bytes: int, workers: int | None = None
) -> dict[str, Any]:
    """Write the shards (and the index when more than one); returns file -> sha256 and the total."""
    shards = split_shards(specs, shard_bytes)
    n = len(shards)
    names = ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    # Shards are independent: one thread each (numpy's generator, hashlib and file writes release
    # the GIL), so a 16 GB twin is written at several times one core's speed.
    with ThreadPoolExecutor(max_workers=max(1, min(n, workers or os.cpu_count() or 1))) as pool:
        digests = dict(zip(names, pool.map(lambda fs: _write_shard(folder / fs[0], fs[1], seed), zip(names, shards))))
    weight_map = {s.name: fname for fname, shard in zip(names, shards) for s in shard}
    total = sum(s.nbytes for s in specs)
    if n > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return {"shards": digests, "total_size": total}
