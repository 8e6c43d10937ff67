"""Random-weight twins: checkpoints with a target's exact architecture and storage format.

Decode latency does not depend on weight values once the output length is fixed, so a twin with the
target's shapes, dtypes and quantization layout stands in for a model that cannot be fetched (for
latency only, never for accuracy). The twin is stamped (`twin_of`) so nothing mistakes it for the real
model.

    python run_e2e.py twin --like gemma-3-27b-it-w4a16 --out /tmp/twin --tokenizer-from DIR [--seed N]
    python run_e2e.py twin --like gemma-3-27b-it-w4a16 --multimodal --out ...   (the served wrapper)
    python run_e2e.py twin --like gemma3-27b-attn-tiny --out ...               (bf16, 12 layers)
    python run_e2e.py twin --like path/to/config.json --out ...                (any transformers arch)
    python run_e2e.py twin --pack-tokenizer assets/gemma-3-270m --out assets/tokenizers/gemma3

How the values are made (all of it plain numpy, so the bytes are the same on every machine):
- one PCG64 stream per tensor, seeded by (seed, crc32(name)): same seed -> byte-identical shards,
  independent of shard size or tensor order;
- int4 weights: random 32-bit words, i.e. eight uniform nibbles each (q in [-8, 7] after the
  compressed-tensors offset of 8); nothing is ever quantized;
- floats are written as bf16 bit patterns with a random sign and mantissa and one fixed exponent
  chosen per tensor, so each linear roughly preserves RMS (within a factor sqrt(2)): the group scales
  are ~ 1/sqrt(21.5 * in_features) (21.5 = E[q^2]), other matrices ~ 1/sqrt(fan_in);
- norm weights: zeros for Gemma's (1 + w) RMSNorm, ones for LayerNorm; biases zero.
Shards are safetensors written tensor by tensor in bounded chunks (no model in memory), hashed as
they are written; the digests go into the stamp.
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import itertools
import json
import lzma
import math
import os
import shutil
import struct
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from e2e.assets import STAMP
from e2e.errors import UserError

TWIN_FORMAT = 1
CHUNK_BYTES = 32 << 20  # generation/write unit; fixed, so it cannot change the bytes
DEFAULT_SHARD_GB = 4.5
Q4_MEAN_SQUARE = 21.5  # E[q^2] for q uniform on [-8, 7]

# -- targets -------------------------------------------------------------------------------------
# google/gemma-3-27b-it text_config, with the defaults of Gemma3TextConfig written out (as a
# checkpoint saved by transformers 4.5x has them). vLLM reads layer_types; rope: local 10k, global 1M
# with linear scaling 8.
GEMMA3_27B_TEXT: dict[str, Any] = {
    "model_type": "gemma3_text",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attn_logit_softcapping": None,
    "bos_token_id": 2,
    "eos_token_id": 1,
    "pad_token_id": 0,
    "final_logit_softcapping": None,
    "head_dim": 128,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 5376,
    "initializer_range": 0.02,
    "intermediate_size": 21504,
    "max_position_embeddings": 131072,
    "num_attention_heads": 32,
    "num_hidden_layers": 62,
    "num_key_value_heads": 16,
    "query_pre_attn_scalar": 168,
    "rms_norm_eps": 1e-06,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    "rope_theta": 1000000.0,
    "sliding_window": 1024,
    "sliding_window_pattern": 6,
    "tie_word_embeddings": True,
    "use_cache": True,
    "vocab_size": 262208,
}
# google/gemma-3-27b-it vision_config (SigLIP so400m at 896 px) and wrapper fields.
GEMMA3_27B_VISION: dict[str, Any] = {
    "model_type": "siglip_vision_model",
    "attention_dropout": 0.0,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_size": 1152,
    "image_size": 896,
    "intermediate_size": 4304,
    "layer_norm_eps": 1e-06,
    "num_attention_heads": 16,
    "num_channels": 3,
    "num_hidden_layers": 27,
    "patch_size": 14,
    "vision_use_head": False,
}
GEMMA3_WRAPPER: dict[str, Any] = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "image_token_index": 262144,
    "eos_token_id": [1, 106],
    "initializer_range": 0.02,
    "mm_tokens_per_image": 256,
}
# The tiny model with gemma-3-27b's attention geometry (../shared/notes/gpu-machine.md).
GEMMA3_ATTN_TINY_TEXT = {**GEMMA3_27B_TEXT, "hidden_size": 1024, "intermediate_size": 4096,
                         "num_hidden_layers": 12}


@dataclass(frozen=True)
class Builtin:
    text: dict[str, Any]
    quantized: bool
    description: str


BUILTINS: dict[str, Builtin] = {
    "gemma-3-27b-it-w4a16": Builtin(
        GEMMA3_27B_TEXT, True,
        "Gemma 3 27B, linear layers compressed-tensors W4A16 (int4 symmetric, group 128)"),
    "gemma3-27b-attn-tiny": Builtin(
        GEMMA3_ATTN_TINY_TEXT, False,
        "12 layers, hidden 1024, gemma-3-27b attention geometry, bf16"),
}


@dataclass(frozen=True)
class QuantScheme:
    """compressed-tensors pack-quantized int weights, symmetric, per group; activations unquantized."""
    bits: int = 4
    group_size: int = 128

    @property
    def pack_factor(self) -> int:
        return 32 // self.bits


W4A16 = QuantScheme()


def quantization_config(scheme: QuantScheme, ignore: list[str]) -> dict[str, Any]:
    """The `quantization_config` of a compressed-tensors W4A16 checkpoint (llm-compressor's form)."""
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "format": "pack-quantized",
                "weights": {
                    "num_bits": scheme.bits, "type": "int", "symmetric": True,
                    "strategy": "group", "group_size": scheme.group_size,
                    "dynamic": False, "actorder": None, "block_structure": None,
                    "observer": "minmax", "observer_kwargs": {},
                },
                "input_activations": None,
                "output_activations": None,
            }
        },
        "ignore": ignore,
        "kv_cache_scheme": None,
    }


def _layer_types(n_layers: int, pattern: int) -> list[str]:
    return ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n_layers)]


def _apply_overrides(cfg: dict[str, Any], overrides: dict[str, Any]) -> None:
    """`key` sets cfg[key]; `a.b` sets cfg[a][b] (e.g. vision_config.num_hidden_layers)."""
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = cfg
        for p in parents:
            if not isinstance(node.get(p), dict):
                raise UserError(f"--set {key}: {p} is not a section of the config")
            node = node[p]
        node[leaf] = value


@dataclass(frozen=True)
class Target:
    """What to build: the config.json to write and how to store the linear layers."""
    name: str
    config: dict[str, Any]
    quant: QuantScheme | None
    multimodal: bool


def resolve_target(like: str, multimodal: bool = False, overrides: dict[str, Any] | None = None) -> Target:
    """A built-in name or a config.json path -> the twin's full config.json (quantization included).

    Overrides apply to the text config of a built-in (`vision_config.X` to the vision tower) and to
    the top level of a config.json.
    """
    overrides = dict(overrides or {})
    if like in BUILTINS:
        b = BUILTINS[like]
        text = copy.deepcopy(b.text)
        vis = {k[len("vision_config."):]: v for k, v in overrides.items() if k.startswith("vision_config.")}
        _apply_overrides(text, {k: v for k, v in overrides.items() if not k.startswith("vision_config.")})
        text["layer_types"] = _layer_types(text["num_hidden_layers"], text["sliding_window_pattern"])
        quant = W4A16 if b.quantized else None
        if multimodal:
            vision = copy.deepcopy(GEMMA3_27B_VISION)
            _apply_overrides(vision, vis)
            cfg = {**GEMMA3_WRAPPER, "text_config": text, "vision_config": vision}
            ignore = ["lm_head", "re:.*vision_tower.*", "re:.*multi_modal_projector.*"]
        else:
            if vis:
                raise UserError("--set vision_config.*: only with --multimodal")
            cfg = {"architectures": ["Gemma3ForCausalLM"], **text}
            ignore = ["lm_head"]
        cfg["torch_dtype"] = "bfloat16"
        if quant:
            cfg["quantization_config"] = quantization_config(quant, ignore)
        return Target(like, cfg, quant, multimodal)

    path = Path(like)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise UserError(f"--like {like!r}: not a built-in ({', '.join(BUILTINS)}) and no config.json there")
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"--like {path}: cannot read JSON: {exc}") from None
    if multimodal:
        raise UserError("--multimodal applies to built-ins; a config.json is built as it is")
    _apply_overrides(cfg, overrides)
    quant = _scheme_of(cfg.get("quantization_config"), path)
    name = cfg.get("_name_or_path") or path.parent.name
    return Target(str(name), cfg, quant, "vision_config" in cfg)


def _scheme_of(qc: dict[str, Any] | None, path: Path) -> QuantScheme | None:
    """Only compressed-tensors pack-quantized symmetric int group weights are reproduced."""
    if not qc:
        return None
    groups = list((qc.get("config_groups") or {}).values())
    w = groups[0].get("weights") if len(groups) == 1 else None
    ok = (qc.get("quant_method") == "compressed-tensors" and qc.get("format") == "pack-quantized" and w
          and w.get("type") == "int" and w.get("symmetric") and w.get("strategy") == "group"
          and w.get("num_bits") in (4, 8) and not w.get("actorder") == "group")
    if not ok:
        raise UserError(f"{path}: quantization_config is not one this builder reproduces "
                        "(compressed-tensors pack-quantized, int, symmetric, group, one config group)")
    return QuantScheme(bits=w["num_bits"], group_size=w["group_size"])


# -- what tensors the checkpoint holds -----------------------------------------------------------
DTYPES = {"BF16": (2, np.uint16), "I32": (4, np.int32), "I64": (8, np.int64)}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype name
    fill: str   # packed | scale | shape | random | zeros | ones
    rms: float = 0.0          # target RMS for random/scale
    value: tuple[int, ...] = ()  # for fill == "shape"

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype][0]


def _is_ignored(module_name: str, ignore: list[str]) -> bool:
    import re
    for pat in ignore:
        if pat.startswith("re:"):
            if re.match(pat[3:], module_name):
                return True
        elif module_name == pat or module_name.endswith("." + pat):
            return True
    return False


def tensor_plan(target: Target) -> list[TensorSpec]:
    """Every tensor of the checkpoint, in the model's parameter order, with HF checkpoint names.

    Names and shapes come from transformers' own model class built on the meta device (no memory);
    linear layers not in the quantization `ignore` list become weight_packed / weight_scale /
    weight_shape, exactly what vLLM's CompressedTensorsWNA16.create_weights registers.
    """
    import torch
    from torch import nn
    from transformers import AutoConfig

    cfg = {k: v for k, v in target.config.items() if k != "quantization_config"}
    model_type = cfg.pop("model_type", None)
    if not model_type:
        raise UserError("config has no model_type")
    try:
        hf_config = AutoConfig.for_model(model_type, **cfg)
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"transformers cannot build a {model_type!r} config: {exc}") from None
    model = _meta_model(hf_config, cfg.get("architectures") or [])
    ignore = (target.config.get("quantization_config") or {}).get("ignore", ["lm_head"])
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    layernorms = {n for n, m in model.named_modules() if isinstance(m, nn.LayerNorm)}
    specs: list[TensorSpec] = []
    for name, p in model.named_parameters():  # tied weights appear once (lm_head is tied in Gemma)
        mod, _, leaf = name.rpartition(".")
        shape = tuple(p.shape)
        if p.dtype != torch.bfloat16:
            raise UserError(f"{name}: parameter dtype {p.dtype}, this builder writes bf16 only")
        if target.quant and mod in linears and leaf == "weight" and not _is_ignored(mod, ignore):
            specs += _quantized_linear(mod, shape, target.quant)
        elif len(shape) >= 2:
            specs.append(TensorSpec(name, shape, "BF16", "random", rms=1.0 / math.sqrt(math.prod(shape[1:]))))
        elif leaf == "weight" and mod in layernorms:
            specs.append(TensorSpec(name, shape, "BF16", "ones"))
        else:  # biases; Gemma RMSNorm weights (scale is 1 + w)
            specs.append(TensorSpec(name, shape, "BF16", "zeros"))
    if target.config.get("model_type") == "gemma3":
        specs = [TensorSpec(_published_gemma3_name(s.name), s.shape, s.dtype, s.fill, s.rms, s.value)
                 for s in specs]
    return specs


# transformers 5 names the wrapper's tensors model.language_model.* / model.vision_tower.embeddings.*;
# the published gemma-3 checkpoints (and vLLM's SiglipVisionModel) use these:
_GEMMA3_PUBLISHED = (("model.language_model.", "language_model.model."),
                     ("model.vision_tower.vision_model.", "vision_tower.vision_model."),
                     ("model.vision_tower.", "vision_tower.vision_model."),
                     ("model.multi_modal_projector.", "multi_modal_projector."))


def _published_gemma3_name(name: str) -> str:
    for old, new in _GEMMA3_PUBLISHED:
        if name.startswith(old):
            return new + name[len(old):]
    return name


def _meta_model(hf_config: Any, architectures: list[str]) -> Any:
    import torch
    import transformers

    cls = None
    for arch in architectures:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            break
    if cls is None:
        cls = transformers.AutoModelForCausalLM
    with torch.device("meta"):
        if cls is transformers.AutoModelForCausalLM:
            return cls.from_config(hf_config, dtype=torch.bfloat16)
        return cls._from_config(hf_config, dtype=torch.bfloat16)


def _quantized_linear(mod: str, shape: tuple[int, ...], q: QuantScheme) -> list[TensorSpec]:
    out_f, in_f = shape
    if in_f % q.group_size:
        raise UserError(f"{mod}: in_features {in_f} is not a multiple of group size {q.group_size}")
    mean_sq = Q4_MEAN_SQUARE if q.bits == 4 else ((1 << q.bits) ** 2 - 1) / 12 + 0.25
    return [
        TensorSpec(f"{mod}.weight_packed", (out_f, in_f // q.pack_factor), "I32", "packed"),
        TensorSpec(f"{mod}.weight_scale", (out_f, in_f // q.group_size), "BF16", "scale",
                   rms=1.0 / math.sqrt(mean_sq * in_f)),
        TensorSpec(f"{mod}.weight_shape", (2,), "I64", "shape", value=(out_f, in_f)),
    ]


# -- int4 packing (compressed-tensors pack_to_int32 layout) ---------------------------------------
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
        yield memoryview(np.full(spec.shape, 0x3F80 if spec.fill == "ones" else 0, dtype="<u2")).cast("B")
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
        yield memoryview(raw).cast("B")[:n]
        left -= n


# -- safetensors, streamed ------------------------------------------------------------------------
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
        blocks = itertools.chain([_safetensors_header(shard)], (c for s in shard for c in tensor_chunks(s, seed)))
        for block in blocks:  # a generator: one chunk per thread in memory at a time
            h.update(block)
            f.write(block)
    return h.hexdigest()


def write_shards(specs: list[TensorSpec], folder: Path, seed: int, shard_bytes: int,
                 workers: int | None = None) -> dict[str, Any]:
    """Write the shards (and the index when more than one); returns file -> sha256 and the total."""
    shards = split_shards(specs, shard_bytes)
    n = len(shards)
    names = ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    # Shards are independent: one thread each (numpy's generator, hashlib and file writes release
    # the GIL), so a 16 GB twin is written at several times one core's speed.
    with ThreadPoolExecutor(max_workers=max(1, min(n, workers or os.cpu_count() or 1))) as pool:
        digests = dict(zip(names, pool.map(lambda fs: _write_shard(folder / fs[0], fs[1], seed),
                                           zip(names, shards))))
    weight_map = {s.name: fname for fname, shard in zip(names, shards) for s in shard}
    total = sum(s.nbytes for s in specs)
    if n > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return {"shards": digests, "total_size": total}


# -- tokenizer -------------------------------------------------------------------------------------
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "chat_template.jinja", "chat_template.json",
                   "vocab.json", "merges.txt", "added_tokens.json")


def pack_tokenizer(src: Path, out: Path) -> Path:
    """A compact copy of a tokenizer to carry to the GPU machine: big files xz-compressed."""
    src, out = Path(src), Path(out)
    found = [f for f in TOKENIZER_FILES if (src / f).is_file()]
    if "tokenizer.json" not in found and "tokenizer.model" not in found:
        raise UserError(f"--pack-tokenizer {src}: no tokenizer.json or tokenizer.model there")
    out.mkdir(parents=True, exist_ok=True)
    for f in found:
        data = (src / f).read_bytes()
        if len(data) > (1 << 20):
            (out / (f + ".xz")).write_bytes(lzma.compress(data, preset=9))
        else:
            (out / f).write_bytes(data)
    return out


def install_tokenizer(src: Path, dest: Path) -> list[str]:
    """Copy tokenizer files from a model folder or a pack_tokenizer folder (decompressing .xz)."""
    src = Path(src)
    if not src.is_dir():
        raise UserError(f"--tokenizer-from {src}: not a folder")
    got = []
    for f in TOKENIZER_FILES:
        if (src / f).is_file():
            shutil.copyfile(src / f, dest / f)
        elif (src / (f + ".xz")).is_file():
            (dest / f).write_bytes(lzma.decompress((src / (f + ".xz")).read_bytes()))
        else:
            continue
        got.append(f)
    if "tokenizer.json" not in got and "tokenizer.model" not in got:
        raise UserError(f"--tokenizer-from {src}: no tokenizer.json(.xz) or tokenizer.model there")
    return got


# The multimodal wrapper needs Gemma3Processor's files (google/gemma-3-27b-it's) and the image tokens;
# a text-only Gemma 3 tokenizer (gemma-3-270m's) lacks <image_soft_token>, which the wrapper puts at
# image_token_index 262144, just past the text vocabulary.
GEMMA3_PREPROCESSOR = {
    "do_convert_rgb": None, "do_normalize": True, "do_pan_and_scan": None, "do_rescale": True,
    "do_resize": True, "image_mean": [0.5, 0.5, 0.5], "image_processor_type": "Gemma3ImageProcessor",
    "image_seq_length": 256, "image_std": [0.5, 0.5, 0.5], "pan_and_scan_max_num_crops": None,
    "pan_and_scan_min_crop_size": None, "pan_and_scan_min_ratio_to_activate": None,
    "processor_class": "Gemma3Processor", "resample": 2, "rescale_factor": 0.00392156862745098,
    "size": {"height": 896, "width": 896},
}
GEMMA3_IMAGE_TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                       "image_token": "<image_soft_token>"}


def add_gemma3_processor(folder: Path, config: dict[str, Any]) -> None:
    """Processor files and image special tokens for a Gemma3ForConditionalGeneration twin."""
    image_size = config["vision_config"]["image_size"]
    pre = {**GEMMA3_PREPROCESSOR, "image_seq_length": config["mm_tokens_per_image"],
           "size": {"height": image_size, "width": image_size}}
    (folder / "preprocessor_config.json").write_text(json.dumps(pre, indent=2) + "\n")
    (folder / "processor_config.json").write_text(json.dumps(
        {"image_seq_length": config["mm_tokens_per_image"], "processor_class": "Gemma3Processor"}, indent=2) + "\n")
    tj = folder / "tokenizer.json"
    if tj.is_file():
        tok = json.loads(tj.read_text())
        have = {t["content"] for t in tok["added_tokens"]}
        if "<image_soft_token>" not in have:
            tok["added_tokens"].append({"id": config["image_token_index"], "content": "<image_soft_token>",
                                        "single_word": False, "lstrip": False, "rstrip": False,
                                        "normalized": False, "special": True})
            tj.write_text(json.dumps(tok, ensure_ascii=False))
    tc = folder / "tokenizer_config.json"
    if tc.is_file():
        data = json.loads(tc.read_text())
        data.setdefault("extra_special_tokens", {}).update(GEMMA3_IMAGE_TOKENS)
        data.update(GEMMA3_IMAGE_TOKENS)
        tc.write_text(json.dumps(data, indent=2) + "\n")


# -- build -----------------------------------------------------------------------------------------
def twin_key(target: Target, seed: int) -> str:
    digest = hashlib.sha256(json.dumps(target.config, sort_keys=True).encode()).hexdigest()[:16]
    return f"twin:{TWIN_FORMAT}:{target.name}:{seed}:{digest}"


def storage_format(target: Target) -> str:
    if target.quant:
        return (f"compressed-tensors pack-quantized W{target.quant.bits}A16 "
                f"(int, symmetric, group {target.quant.group_size}); other tensors bf16")
    return "bf16"


def build_twin(like: str, out: Path, seed: int = 0, multimodal: bool = False,
               tokenizer_from: Path | None = None, overrides: dict[str, Any] | None = None,
               shard_gb: float = DEFAULT_SHARD_GB, force: bool = False) -> Path:
    """Build (or find already built) the twin of `like` in `out`; returns `out`."""
    target = resolve_target(like, multimodal, overrides)
    out = Path(out)
    key = twin_key(target, seed)
    stamp = out / STAMP
    if not force and stamp.is_file() and json.loads(stamp.read_text()).get("key") == key:
        return out
    specs = tensor_plan(target)
    total = sum(s.nbytes for s in specs)
    out.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(out.parent).free
    if free < total * 1.05:
        raise UserError(f"--out {out}: {total / 1e9:.1f} GB needed, {free / 1e9:.1f} GB free there")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    t0 = time.monotonic()
    written = write_shards(specs, tmp, seed, int(shard_gb * 1e9))
    (tmp / "config.json").write_text(json.dumps(target.config, indent=2) + "\n")
    (tmp / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0}
        if "gemma" in str(target.config.get("model_type")) else {}, indent=2) + "\n")
    tok = install_tokenizer(tokenizer_from, tmp) if tokenizer_from else []
    if target.config.get("model_type") == "gemma3":
        add_gemma3_processor(tmp, target.config)
    info = {"twin_of": target.name, "seed": seed, "format": storage_format(target),
            "multimodal": target.multimodal, "overrides": dict(overrides or {}), "random_weights": True, "twin_format": TWIN_FORMAT,
            "generator": "numpy PCG64 per tensor, SeedSequence([seed, crc32(name)])",
            "tokenizer_from": str(tokenizer_from) if tokenizer_from else None, "tokenizer_files": tok,
            "build_s": round(time.monotonic() - t0, 1), **written}
    (tmp / STAMP).write_text(json.dumps({"key": key, **info}, indent=1) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def read_stamp(folder: Path) -> dict[str, Any] | None:
    """The twin stamp of a model folder, or None for anything that is not a twin."""
    p = Path(folder) / STAMP
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if data.get("twin_of") else None


# -- command line ----------------------------------------------------------------------------------
def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--like", help=f"built-in ({', '.join(BUILTINS)}) or a config.json / model folder")
    p.add_argument("--out", type=Path, help="output folder (the twin, or the packed tokenizer)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--multimodal", action="store_true",
                   help="built-ins: the Gemma3ForConditionalGeneration wrapper with its vision tower")
    p.add_argument("--tokenizer-from", type=Path, help="folder with tokenizer files (plain or packed)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                   help="override a config field (num_hidden_layers=2, vision_config.num_hidden_layers=1)")
    p.add_argument("--shard-gb", type=float, default=DEFAULT_SHARD_GB, help="shard size (default %(default)s)")
    p.add_argument("--force", action="store_true", help="rebuild even if the stamp matches")
    p.add_argument("--pack-tokenizer", type=Path, metavar="SRC",
                   help="instead of a twin: write a compact (xz) copy of SRC's tokenizer to --out")
    p.add_argument("--list", action="store_true", help="list the built-in targets")


def parse_sets(items: list[str]) -> dict[str, Any]:
    ov: dict[str, Any] = {}
    for kv in items:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            raise UserError(f"--set {kv!r}: use KEY=JSON")
        try:
            ov[k] = json.loads(v)
        except json.JSONDecodeError:
            raise UserError(f"--set {kv!r}: value is not JSON") from None
    return ov


def main(a: argparse.Namespace) -> int:
    if a.list:
        for name, b in BUILTINS.items():
            print(f"{name}: {b.description}")
        return 0
    if a.out is None:
        raise UserError("twin needs --out DIR")
    if a.pack_tokenizer:
        out = pack_tokenizer(a.pack_tokenizer, a.out)
        size = sum(f.stat().st_size for f in out.iterdir())
        print(f"{out} ({size / 1e6:.1f} MB)")
        return 0
    if not a.like:
        raise UserError("twin needs --like NAME|CONFIG.json (see --list)")
    if a.shard_gb <= 0:
        raise UserError("--shard-gb must be positive")
    t0 = time.monotonic()
    out = build_twin(a.like, a.out, a.seed, a.multimodal, a.tokenizer_from, parse_sets(a.set),
                     a.shard_gb, a.force)
    st = json.loads((out / STAMP).read_text())
    print(f"{out}: twin of {st['twin_of']}, seed {st['seed']}, {st['format']}, "
          f"{st['total_size'] / 1e9:.2f} GB in {len(st['shards'])} shard(s), "
          f"{time.monotonic() - t0:.1f} s")
    return 0

