"""Build a twin folder: plan the tensors, write the shards, config, tokenizer and stamp, then move the
finished folder into place (a half-written twin is never left under --out). Only a folder the tool
made is replaced (e2e/twin/stamp.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any

from e2e.errors import UserError
from e2e.twin.shards import DEFAULT_SHARD_GB, write_shards
from e2e.twin.stamp import check_buildable, finish_partial, stamped, start_partial, write_stamp
from e2e.twin.targets import Target, resolve_target
from e2e.twin.tensors import tensor_plan
from e2e.twin.tokenizer import add_gemma3_processor, install_tokenizer

TWIN_FORMAT = 1


def twin_key(target: Target, seed: int) -> str:
    digest = hashlib.sha256(json.dumps(target.config, sort_keys=True).encode()).hexdigest()[:16]
    return f"twin:{TWIN_FORMAT}:{target.name}:{seed}:{digest}"


def storage_format(target: Target) -> str:
    if target.quant:
        return (
            f"compressed-tensors pack-quantized W{target.quant.bits}A16 "
            f"(int, symmetric, group {target.quant.group_size}); other tensors bf16"
        )
    return "bf16"


def generation_config(config: dict[str, Any]) -> dict[str, Any]:
    if "gemma" in str(config.get("model_type")):
        return {"bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0}
    # Other models: the token ids of their config, as transformers' save_pretrained writes them.
    ids = ("bos_token_id", "eos_token_id", "pad_token_id")
    return {k: config[k] for k in ids if config.get(k) is not None}


def build_twin(
    like: str,
    out: Path,
    seed: int = 0,
    multimodal: bool = False,
    tokenizer_from: Path | None = None,
    overrides: dict[str, Any] | None = None,
    shard_gb: float = DEFAULT_SHARD_GB,
    force: bool = False,
) -> Path:
    """Build (or find already built) the twin of `like` in `out`; returns `out`."""
    target = resolve_target(like, multimodal, overrides)
    out = Path(out)
    key = twin_key(target, seed)
    if not force and stamped(out, key):
        return out
    check_buildable(out, f"--out {out}")  # before the plan: a user's folder is refused at once
    specs = tensor_plan(target)
    total = sum(s.nbytes for s in specs)
    out.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(out.parent).free
    if free < total * 1.05:
        raise UserError(f"--out {out}: {total / 1e9:.1f} GB needed, {free / 1e9:.1f} GB free there")
    tmp = start_partial(out)
    t0 = time.monotonic()
    written = write_shards(specs, tmp, seed, int(shard_gb * 1e9))
    (tmp / "config.json").write_text(json.dumps(target.config, indent=2) + "\n")
    (tmp / "generation_config.json").write_text(json.dumps(generation_config(target.config), indent=2) + "\n")
    tok = install_tokenizer(tokenizer_from, tmp) if tokenizer_from else []
    if target.config.get("model_type") == "gemma3":
        add_gemma3_processor(tmp, target.config)
    info = {
        "twin_of": target.name,
        "seed": seed,
        "format": storage_format(target),
        "multimodal": target.multimodal,
        "overrides": dict(overrides or {}),
        "random_weights": True,
        "twin_format": TWIN_FORMAT,
        "generator": "numpy PCG64 per tensor, SeedSequence([seed, crc32(name)])",
        "tokenizer_from": str(tokenizer_from) if tokenizer_from else None,
        "tokenizer_files": tok,
        "build_s": round(time.monotonic() - t0, 1),
        **written,
    }
    write_stamp(tmp, key, info)
    return finish_partial(tmp, out, f"--out {out}")
