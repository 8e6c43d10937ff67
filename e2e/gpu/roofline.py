"""The HBM floor of one decode step: bytes every step must read, over the GPU's memory bandwidth.

Per GPU at tensor parallel size TP, one decode step (batch 1) reads at least
  * every decoder linear weight once, at its stored size (compressed-tensors W4A16
    pack-quantized: 4 bits per weight plus one bf16 scale per group of 128, plus a zero point when
    asymmetric), split over TP;
  * the lm_head matrix once (bf16; tied embeddings count once; the input embedding lookup reads one
    row, which is left out), split over TP (vocab-parallel);
  * the KV cache of every layer for the context: depth tokens for a global layer, at most the
    sliding window for a sliding one (Gemma 3: five sliding layers then one global), K and V,
    KV heads split over TP (never fewer than one per GPU).
Norms and biases are left out (under 0.1 % for the models here). Vision towers are not read
during text decode and are left out. The floor is a lower bound: measured / floor says how far
above the memory-bound limit a step runs. The datasheet bandwidth is a peak no kernel reaches, so
floors() also gives the floor against the read bandwidth measured on the run's GPU (e2e.gpu.bandwidth)
when one is passed. Pure: a parsed config.json in, numbers out.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Peak memory bandwidth in GB/s (vendor figures). Matched in order against the GPU name, so more
# specific names come first.
GPU_BANDWIDTH_GBPS: tuple[tuple[str, float], ...] = (
    ("GH200", 4900.0),
    ("H200", 4800.0),
    ("H100 NVL", 3900.0),
    ("H100 PCIE", 2000.0),
    ("H100", 3350.0),  # SXM / HBM3
    ("A100-SXM4-40GB", 1555.0),
    ("A100-PCIE-40GB", 1555.0),
    ("A100", 2039.0),  # 80 GB
    ("MI300X", 5300.0),
    ("MI250X", 3277.0),
    ("L40S", 864.0),
    ("RX 7900 XTX", 960.0),
    ("RX 7900 XT", 800.0),
)

DTYPE_BYTES = {
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "float32": 4,
    "float": 4,
    "fp8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}


class Unavailable(Exception):
    """No floor can be given; the message says why (the report prints it instead of a number)."""


def bandwidth_for(gpu_name: str | None, override_gbps: float | None = None) -> tuple[float, str]:
    """(GB/s, source). The override wins; else the first table entry the name contains."""
    if override_gbps:
        return float(override_gbps), "stats.gpu_bandwidth_gbps"
    if not gpu_name:
        raise Unavailable("no GPU in the run's manifest and no stats.gpu_bandwidth_gbps")
    up = gpu_name.upper()
    for key, bw in GPU_BANDWIDTH_GBPS:
        if key in up:
            return bw, f"table ({key})"
    raise Unavailable(f"unknown GPU {gpu_name!r}: set stats.gpu_bandwidth_gbps")


@dataclass(frozen=True)
class Geometry:
    layers: int
    hidden: int
    intermediate: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    dtype_bytes: int
    sliding: tuple[bool, ...]  # per layer
    window: int | None
    weight_bits: float  # bits per linear weight, scales included
    quant: str


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    tc = cfg.get("text_config")
    if isinstance(tc, dict):
        merged = {**tc}
        for k in ("quantization_config", "tie_word_embeddings", "torch_dtype", "dtype"):
            if k not in merged and k in cfg:
                merged[k] = cfg[k]
        return merged
    return cfg


def _sliding_layers(tc: dict[str, Any], n: int) -> tuple[bool, ...]:
    types = tc.get("layer_types")
    if isinstance(types, list) and len(types) == n:
        return tuple(t == "sliding_attention" for t in types)
    window = tc.get("sliding_window")
    mt = str(tc.get("model_type", ""))
    if not window:
        return (False,) * n
    if mt.startswith("gemma3"):
        pattern = int(tc.get("sliding_window_pattern") or 6)  # every 6th layer global
        return tuple((i + 1) % pattern != 0 for i in range(n))
    if mt.startswith("gemma2"):
        return tuple(i % 2 == 0 for i in range(n))
    if tc.get("use_sliding_window") is False:
        return (False,) * n
    return (True,) * n  # mistral-style: every layer slides


def _weight_bits(tc: dict[str, Any], dtype_bytes: int) -> tuple[float, str]:
    q = tc.get("quantization_config")
    if not q:
        return 8.0 * dtype_bytes, "none"
    method = q.get("quant_method")
    if method == "compressed-tensors":
        groups = list((q.get("config_groups") or {}).values())
        if len(groups) != 1 or not groups[0].get("weights"):
            raise Unavailable("compressed-tensors config with several or no weight groups is not modelled")
        w = groups[0]["weights"]
        bits, gs = int(w["num_bits"]), w.get("group_size")
        if w.get("type", "int") != "int" or w.get("strategy") not in ("group", "channel"):
            raise Unavailable(f"compressed-tensors weights {w.get('type')}/{w.get('strategy')} not modelled")
        per_group = 16.0 * (1 if w.get("symmetric", True) else 2)  # bf16 scale (+ zero point)
        extra = per_group / gs if gs else 0.0
        return bits + extra, f"compressed-tensors int{bits} group {gs} ({q.get('format')})"
    if method in ("gptq", "awq"):
        bits, gs = int(q["bits"]), int(q.get("group_size") or 128)
        return bits + (16.0 + bits) / gs, f"{method} int{bits} group {gs}"
    raise Unavailable(f"quantization {method!r} is not modelled")


def geometry(config: dict[str, Any]) -> Geometry:
    """The numbers the floor needs, from a HuggingFace config.json (text_config for multimodal)."""
    tc = _text_config(config)
    try:
        n = int(tc["num_hidden_layers"])
        hidden = int(tc["hidden_size"])
        qh = int(tc["num_attention_heads"])
        kvh = int(tc.get("num_key_value_heads") or qh)
        hd = int(tc.get("head_dim") or hidden // qh)
        inter = int(tc["intermediate_size"])
        vocab = int(tc["vocab_size"])
    except (KeyError, TypeError, ValueError) as exc:
        raise Unavailable(f"config.json lacks {exc}") from None
    dtype = str(tc.get("torch_dtype") or tc.get("dtype") or "bfloat16")
    db = DTYPE_BYTES.get(dtype, 2)
    bits, quant = _weight_bits(tc, db)
    return Geometry(
        n,
        hidden,
        inter,
        qh,
        kvh,
        hd,
        vocab,
        bool(tc.get("tie_word_embeddings", True)),
        db,
        _sliding_layers(tc, n),
        tc.get("sliding_window"),
        bits,
        quant,
    )


def step_bytes(g: Geometry, depth: int, tp: int = 1, kv_bytes: int | None = None) -> dict[str, float]:
    """Bytes one decode step reads per GPU at this depth: weights, lm_head, KV, and their total.
    KV entries are stored at the model's dtype unless kv_bytes says otherwise (fp8 KV: 1)."""
    per_layer = (
        g.hidden * g.q_heads * g.head_dim  # q_proj
        + 2 * g.hidden * g.kv_heads * g.head_dim  # k_proj, v_proj
        + g.q_heads * g.head_dim * g.hidden  # o_proj
        + 3 * g.hidden * g.intermediate
    )  # gate, up, down
    weights = g.layers * per_layer * g.weight_bits / 8 / tp
    lm_head = g.vocab * g.hidden * g.dtype_bytes / tp
    kv_heads_gpu = max(1.0, g.kv_heads / tp)
    kvb = kv_bytes or g.dtype_bytes
    tokens = sum(min(depth, g.window) if s and g.window else depth for s in g.sliding)
    kv = tokens * 2 * kv_heads_gpu * g.head_dim * kvb
    return {"weights": weights, "lm_head": lm_head, "kv": kv, "total": weights + lm_head + kv}


def floor_ms(g: Geometry, depth: int, tp: int, bandwidth_gbps: float) -> float:
    """The memory-bound time of one decode step in ms."""
    return step_bytes(g, depth, tp)["total"] / (bandwidth_gbps * 1e9) * 1e3


def read_model_config(model_path: str, search: tuple[Path, ...] = ()) -> dict[str, Any]:
    """config.json of a local model folder; Unavailable when the folder is absent (a hub name, or
    the run was analysed on another machine): never guess a geometry."""
    candidates = [Path(model_path)] + [Path(b) / model_path for b in search]
    for c in candidates:
        f = c / "config.json"
        if f.is_file():
            try:
                cfg: dict[str, Any] = json.loads(f.read_text())
                return cfg
            except (OSError, json.JSONDecodeError) as exc:
                raise Unavailable(f"{f}: unreadable ({exc})") from None
    raise Unavailable(f"model folder {model_path!r} not found here (no config.json)")


def floors(
    model_config: dict[str, Any],
    depths: list[int],
    tp: int,
    gpu_name: str | None,
    override_gbps: float | None = None,
    measured_gbps: float | None = None,
    measured_source: str = "measured (e2e.gpu.bandwidth: torch.sum read stream)",
) -> dict[str, Any]:
    """Floor per depth as a JSON-ready dict (or raises Unavailable).

    Each depth has floor_ms against the datasheet (or stats.gpu_bandwidth_gbps) and
    floor_measured_ms against measured_gbps, the read bandwidth this GPU reached in this run (None
    when not given). The bandwidth behind each is at the top: bandwidth_gbps / bandwidth_source and
    measured_bandwidth_gbps / measured_bandwidth_source. With a measurement, a GPU missing from the
    table still gets its measured floors (floor_ms None, bandwidth_source saying why); without one
    it raises, as before."""
    g = geometry(model_config)
    measured = (
        float(measured_gbps)
        if isinstance(measured_gbps, (int, float)) and math.isfinite(measured_gbps) and measured_gbps > 0
        else None
    )
    try:
        bw, source = bandwidth_for(gpu_name, override_gbps)
    except Unavailable as exc:
        if measured is None:
            raise
        bw, source = None, f"unavailable: {exc}"
    per_depth = {}
    for d in depths:
        b = step_bytes(g, d, tp)
        per_depth[str(d)] = {
            "bytes_per_gpu": b,
            "floor_ms": b["total"] / (bw * 1e9) * 1e3 if bw else None,
            "floor_measured_ms": b["total"] / (measured * 1e9) * 1e3 if measured else None,
        }
    return {
        "available": True,
        "bandwidth_gbps": bw,
        "bandwidth_source": source,
        "measured_bandwidth_gbps": measured,
        "measured_bandwidth_source": measured_source if measured else None,
        "measured_fraction_of_datasheet": measured / bw if measured and bw else None,
        "gpu": gpu_name,
        "tp": tp,
        "quantization": g.quant,
        "weight_bits": g.weight_bits,
        "sliding_layers": sum(g.sliding),
        "global_layers": g.layers - sum(g.sliding),
        "window": g.window,
        "per_depth": per_depth,
    }
