"""What tensors a twin's checkpoint holds: names, shapes, dtypes and how each is filled.

Names and shapes come from transformers' own model class built on the meta device; quantized linears
get the compressed-tensors layout that vLLM registers.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from e2e.errors import UserError
from e2e.twin.targets import QuantScheme, Target

Q4_MEAN_SQUARE = 21.5  # E[q^2] for q uniform on [-8, 7]
DTYPES = {"BF16": (2, np.uint16), "I32": (4, np.int32), "I64": (8, np.int64)}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # safetensors dtype name
    fill: str  # packed | scale | shape | random | zeros | ones
    rms: float = 0.0  # target RMS for random/scale
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
    modules = dict(model.named_modules())
    linears = {n for n, m in modules.items() if isinstance(m, nn.Linear)}
    neutral: dict[type, str] = {}
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
        elif leaf == "weight":  # norm weights
            specs.append(TensorSpec(name, shape, "BF16", _neutral_fill(modules[mod], neutral)))
        else:  # biases
            specs.append(TensorSpec(name, shape, "BF16", "zeros"))
    if target.config.get("model_type") == "gemma3":
        specs = [TensorSpec(_published_gemma3_name(s.name), s.shape, s.dtype, s.fill, s.rms, s.value) for s in specs]
    return specs


def _neutral_fill(module: Any, cache: dict[type, str]) -> str:
    """ "zeros" or "ones": the weight that makes this norm a plain normalisation.

    Gemma's RMSNorm scales by (1 + w), LayerNorm and Llama's RMSNorm by w (zeros there would zero the
    residual stream). Found by running a CPU copy of the module with every parameter 0 on ones: a
    zero output means it scales by w. A module that does not run that way gets ones, the choice
    that cannot silence the model.
    """
    kind = type(module)
    if kind not in cache:
        import torch

        cache[kind] = "ones"
        try:
            probe = copy.deepcopy(module).to_empty(device="cpu")
            with torch.no_grad():
                for t in [*probe.parameters(), *probe.buffers()]:
                    t.zero_()
                y = probe(torch.ones(1, 1, module.weight.shape[-1], dtype=module.weight.dtype))
            if torch.is_tensor(y) and torch.count_nonzero(y) == y.numel():
                cache[kind] = "zeros"
        except Exception:  # any module may sit here; ones is the safe fill
            pass
    return cache[kind]


# transformers 5 names the wrapper's tensors model.language_model.* / model.vision_tower.embeddings.*;
# the published gemma-3 checkpoints (and vLLM's SiglipVisionModel) use these:
_GEMMA3_PUBLISHED = (
    ("model.language_model.", "language_model.model."),
    ("model.vision_tower.vision_model.", "vision_tower.vision_model."),
    ("model.vision_tower.", "vision_tower.vision_model."),
    ("model.multi_modal_projector.", "multi_modal_projector."),
)


def _published_gemma3_name(name: str) -> str:
    for old, new in _GEMMA3_PUBLISHED:
        if name.startswith(old):
            return new + name[len(old) :]
    return name


def _meta_model(hf_config: Any, architectures: list[str]) -> Any:
    import torch
    import transformers

    cls: Any = None  # a transformers model class, found by its architecture's name
    for arch in architectures:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            break
    with torch.device("meta"):
        if cls is None:  # no class of that name: the auto class picks one from the config
            return transformers.AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16)
        return cls._from_config(hf_config, dtype=torch.bfloat16)


def _quantized_linear(mod: str, shape: tuple[int, ...], q: QuantScheme) -> list[TensorSpec]:
    out_f, in_f = shape
    if in_f % q.group_size:
        raise UserError(f"{mod}: in_features {in_f} is not a multiple of group size {q.group_size}")
    mean_sq = Q4_MEAN_SQUARE if q.bits == 4 else ((1 << q.bits) ** 2 - 1) / 12 + 0.25
    return [
        TensorSpec(f"{mod}.weight_packed", (out_f, in_f // q.pack_factor), "I32", "packed"),
        TensorSpec(
            f"{mod}.weight_scale", (out_f, in_f // q.group_size), "BF16", "scale", rms=1.0 / math.sqrt(mean_sq * in_f)
        ),
        TensorSpec(f"{mod}.weight_shape", (2,), "I64", "shape", value=(out_f, in_f)),
    ]
