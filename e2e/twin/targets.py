"""What a twin is built like: the built-in targets, --like config.json files, overrides, quantization.

The result is a Target: the config.json the twin writes, whole (quantization_config included), and the
scheme its linear layers are stored in.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.errors import UserError

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
GEMMA3_ATTN_TINY_TEXT = {**GEMMA3_27B_TEXT, "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 12}


@dataclass(frozen=True)
class Builtin:
    text: dict[str, Any]
    quantized: bool
    description: str


BUILTINS: dict[str, Builtin] = {
    "gemma-3-27b-it-w4a16": Builtin(
        GEMMA3_27B_TEXT, True, "Gemma 3 27B, linear layers compressed-tensors W4A16 (int4 symmetric, group 128)"
    ),
    "gemma3-27b-attn-tiny": Builtin(
        GEMMA3_ATTN_TINY_TEXT, False, "12 layers, hidden 1024, gemma-3-27b attention geometry, bf16"
    ),
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
                    "num_bits": scheme.bits,
                    "type": "int",
                    "symmetric": True,
                    "strategy": "group",
                    "group_size": scheme.group_size,
                    "dynamic": False,
                    "actorder": None,
                    "block_structure": None,
                    "observer": "minmax",
                    "observer_kwargs": {},
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
        vis = {k[len("vision_config.") :]: v for k, v in overrides.items() if k.startswith("vision_config.")}
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
    if cfg.get("dtype") is None and cfg.get("torch_dtype") is None:
        cfg["torch_dtype"] = "bfloat16"  # what is written; unstated, loaders would take float32
    quant = _scheme_of(cfg.get("quantization_config"), path)
    name = cfg.get("_name_or_path") or path.parent.name
    return Target(str(name), cfg, quant, "vision_config" in cfg)


def _scheme_of(qc: dict[str, Any] | None, path: Path) -> QuantScheme | None:
    """Only compressed-tensors pack-quantized symmetric int group weights are reproduced."""
    if not qc:
        return None
    groups = list((qc.get("config_groups") or {}).values())
    w = groups[0].get("weights") if len(groups) == 1 else None
    ok = (
        qc.get("quant_method") == "compressed-tensors"
        and qc.get("format") == "pack-quantized"
        and w
        and w.get("type") == "int"
        and w.get("symmetric")
        and w.get("strategy") == "group"
        and w.get("num_bits") in (4, 8)
        and not w.get("actorder") == "group"
    )
    if w is None or not ok:
        raise UserError(
            f"{path}: quantization_config is not one this builder reproduces "
            "(compressed-tensors pack-quantized, int, symmetric, group, one config group)"
        )
    return QuantScheme(bits=w["num_bits"], group_size=w["group_size"])
