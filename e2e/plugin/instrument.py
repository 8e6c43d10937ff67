"""Where the recorder's counters attach inside vLLM: each hook wraps one vLLM function so that a
call counts in the recorder (e2e/plugin/recorder.py says what is counted) and then runs unchanged.

    attention   Attention.__init__: the layer is built; its impl class's forward is hooked from there
    forward     the impl class's forward (where it is defined): a call with metadata counts per layer class
    custom op   vllm._custom_ops.paged_attention_rocm, counted with its own arguments
    Triton 2D   kernel_paged_attention_2d: launches through `kernel[grid](...)` count
    steps       GPUModelRunner.execute_model: each return ends a step
    patched     each function an arm's patches change (contract.BUILTIN_TARGETS, a user patch's
                declared targets): its calls; the gate's entry (patches.py) counts its own

Each hook runs when vLLM imports the module concerned (e2e/plugin/hooks.py says why lazily) and
wraps once: a wrapper carries `_e2e`, so a second hook of the same function (a forked child, a
second target module) leaves it alone. Standard library only, as all of e2e/plugin.
"""

from __future__ import annotations

import functools
from typing import Any

from e2e.plugin import hooks, patches
from e2e.plugin.contract import GATES
from e2e.plugin.kernel_args import CountedKernel, custom_op_args
from e2e.plugin.recorder import Recorder
from e2e.plugin.targets import ATTENTION, CUSTOM_OP, FORWARD, STEPS, TRITON_2D

MARK = "_e2e"  # on every wrapper this module makes: never wrap a wrapper


def _marked(fn: Any) -> bool:
    return bool(getattr(fn, MARK, False))


def _mark(fn: Any) -> None:
    vars(fn)[MARK] = True


def install(rec: Recorder) -> None:
    """Attach the counters as vLLM imports the modules concerned; the gate's observer at once."""
    patches.GATE.observer = rec.gate_call
    patches.arm_gate()
    rec.hooked["gate"] = "on import of " + patches.GATE_MODULE
    for target, hook in (
        (ATTENTION, hook_attention),
        (CUSTOM_OP, hook_custom_op),
        (TRITON_2D, hook_triton_2d),
        (STEPS, hook_runner),
    ):
        for name in target.modules:  # each place this target has lived; the first with it wins
            hooks.when_imported(name, functools.partial(hook, rec))


def hook_attention(rec: Recorder, mod: Any) -> None:
    cls = getattr(mod, "Attention", None)
    if cls is None:
        return rec.note_missing(ATTENTION.name, f"{mod.__name__} has no class Attention")
    if _marked(cls.__init__):
        return
    orig_init = cls.__init__

    @functools.wraps(orig_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig_init(self, *args, **kwargs)
        rec.note_layer_built(self)
        impl = getattr(self, "impl", None)
        if impl is not None:
            hook_impl_class(rec, type(impl))

    _mark(__init__)
    cls.__init__ = __init__
    rec.hooked[ATTENTION.name] = f"{mod.__name__}.Attention.__init__"
    rec.missing.pop(ATTENTION.name, None)


def hook_impl_class(rec: Recorder, cls: type) -> None:
    """Hook the forward of an impl class where it is defined (an inherited one once, on its base)."""
    owner: Any = next((c for c in cls.__mro__ if c.__dict__.get("forward") is not None), None)
    if owner is None:
        return rec.note_missing(FORWARD, f"{cls.__module__}.{cls.__name__} has no forward")
    fwd = owner.__dict__["forward"]
    if _marked(fwd):
        return
    path = f"forward:{owner.__name__}"

    @functools.wraps(fwd)
    def forward(
        self: Any, layer: Any, query: Any, key: Any, value: Any, kv_cache: Any, *args: Any, **kwargs: Any
    ) -> Any:
        md = args[0] if args else kwargs.get("attn_metadata")
        if md is None:  # profiling / dummy run: the implementation computes nothing
            return fwd(self, layer, query, key, value, kv_cache, *args, **kwargs)
        prev = rec.current
        rec.current = rec.layer_keys.get(id(layer)) or rec.layer_class(layer, self, kv_cache)
        rec.count(path)
        try:
            return fwd(self, layer, query, key, value, kv_cache, *args, **kwargs)
        finally:
            rec.current = prev

    _mark(forward)
    owner.forward = forward
    rec.hooked[path] = f"{owner.__module__}.{owner.__name__}.forward"


def hook_custom_op(rec: Recorder, mod: Any) -> None:
    fn = getattr(mod, "paged_attention_rocm", None)
    if fn is None:
        return rec.note_missing(CUSTOM_OP.name, f"{mod.__name__} has no paged_attention_rocm")
    if _marked(fn):
        return

    @functools.wraps(fn)
    def paged_attention_rocm(*args: Any, **kwargs: Any) -> Any:
        rec.count("rocm_custom_op", custom_op_args(args, kwargs))
        return fn(*args, **kwargs)

    _mark(paged_attention_rocm)
    mod.paged_attention_rocm = paged_attention_rocm
    rec.hooked[CUSTOM_OP.name] = f"{mod.__name__}.paged_attention_rocm"


def hook_triton_2d(rec: Recorder, mod: Any) -> None:
    kern = getattr(mod, "kernel_paged_attention_2d", None)
    if kern is None:
        return rec.note_missing(TRITON_2D.name, f"{mod.__name__} has no kernel_paged_attention_2d")
    if isinstance(kern, CountedKernel):
        return
    mod.kernel_paged_attention_2d = CountedKernel(kern, rec, "triton_paged_attention_2d")
    rec.hooked[TRITON_2D.name] = f"{mod.__name__}.kernel_paged_attention_2d"


def hook_runner(rec: Recorder, mod: Any) -> None:
    cls: Any = getattr(mod, "GPUModelRunner", None)
    fn = getattr(cls, "execute_model", None) if cls is not None else None
    if fn is None:
        what = "GPUModelRunner" if cls is None else "GPUModelRunner.execute_model"
        return rec.note_missing(STEPS.name, f"{mod.__name__} has no {what}")
    if _marked(fn):
        return

    @functools.wraps(fn)
    def execute_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        finally:
            rec.end_step()

    _mark(execute_model)
    cls.execute_model = execute_model
    where = f"{mod.__name__}.GPUModelRunner.execute_model"
    prev = rec.hooked.get(STEPS.name)  # both runner layouts imported: name both
    rec.hooked[STEPS.name] = f"{prev}, {where}" if prev else where


def watch_patched(rec: Recorder, targets: list[str]) -> None:
    """Count the calls of the functions the arm's patches change. The gate's entry counts itself
    (with vLLM's own answer beside the patch's); any other target is wrapped where it lives, once
    its module is imported, after the patch replaced it (the patch ran first, in register)."""
    for target in dict.fromkeys(targets):
        rec.watch(target)
        if target not in GATES:
            module, qualname = target.split(":")
            hooks.when_imported(module, functools.partial(_wrap_target, rec, target, qualname))


def _wrap_target(rec: Recorder, target: str, qualname: str, mod: Any) -> None:
    *owner_path, name = qualname.split(".")
    owner: Any = mod
    for part in owner_path:
        owner = getattr(owner, part, None)
    raw = owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name, None)
    if raw is None:  # the harness's preflight refuses this before any server; a server says it too
        raise patches.PatchError(f"declared target {target} does not exist (vLLM {patches.vllm_version()})")
    kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
    fn = raw.__func__ if kind is not None else raw
    if _marked(fn):
        return

    @functools.wraps(fn)
    def counted(*args: Any, **kwargs: Any) -> Any:
        rec.patched_call(target)
        return fn(*args, **kwargs)

    _mark(counted)
    setattr(owner, name, kind(counted) if kind is not None else counted)
    rec.hooked[f"patched:{target}"] = f"{mod.__name__}.{qualname}"
