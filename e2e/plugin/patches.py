"""Named patches, applied inside a vLLM process without editing vLLM's files.

Built in (all three replace vllm.platforms.rocm.use_rocm_custom_paged_attention, the gate in front
of vLLM's custom ROCm paged-attention kernel; its only caller imports it from the module on every
call, so replacing the module attribute takes effect):
    widened-gfx11-gate  the gfx11/gfx12 branch with lower bound `gqa_ratio >= 1` instead of `>= 3`
                        (vllm#54210). Built from the installed vLLM's own source: the one comparison
                        `gqa_ratio >= 3` in that function is rewritten and the function recompiled in
                        the module's namespace, so every other condition is the installed version's,
                        unchanged; cached with functools.cache like the original.
    gate-always-on      the gate answers True (kernel-level checks force the custom kernel)
    gate-always-off     the gate answers False (kernel-level checks force the Triton kernel)
User patches are "module:function": the function is called with no arguments. It may declare the
functions it replaces (contract.WRAPS_ATTR, or the decorator contract.wraps): the recorder then counts
their calls, so an arm whose patch is never reached is caught (docs/concepts/arms.md).

A patch whose target does not exist raises PatchError naming the target and the vLLM version.
`apply_patches(names)` works in any process, with or without the plugin's environment.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from e2e.plugin import hooks
from e2e.plugin.contract import GATE_OFF, GATE_ON, TARGET_FORM, USER_PATCH_FORM, WIDENED_GATE, WRAPS_ATTR

GATE_MODULE = "vllm.platforms.rocm"
GATE_FUNC = "use_rocm_custom_paged_attention"
GATE_TARGET = f"{GATE_MODULE}.{GATE_FUNC}"


class CachedGate(Protocol):
    """vLLM's gate and every replacement: a function cached with functools.cache."""

    def __call__(self, *args: Any, **kwargs: Any) -> bool: ...

    def cache_info(self) -> Any: ...

    def cache_clear(self) -> None: ...


class PatchError(RuntimeError):
    """A patch cannot be applied in this process; the message names the target and vLLM version."""


def vllm_version() -> str:
    try:
        import vllm

        return str(getattr(vllm, "__version__", "unknown"))
    except Exception as exc:  # a broken install is worth naming too
        return f"unimportable ({exc!r})"


# -- the gate: one entry installed in the module, delegating to the current implementation ---------
class _Gate:
    """State of the gate in this process (one per process; the plugin and kernels_check share it)."""

    def __init__(self) -> None:
        self.original: CachedGate | None = None  # vLLM's cached function, once imported
        self.impl: CachedGate | None = None  # None: the original
        self.impl_name: str | None = None  # which patch set impl
        # the routing recorder: (args, kwargs, answer, vLLM's own answer under a patch else None)
        self.observer: Callable[[tuple[Any, ...], dict[str, Any], bool, bool | None], None] | None = None
        self.installed = False  # entry placed in the module
        self.widened_code: Any = None  # compiled widened function (code object)
        self.widened_detail: dict[str, Any] = {}


GATE = _Gate()


def _answering() -> CachedGate:
    """The function that answers for the gate now: a patch's, else vLLM's."""
    impl = GATE.impl or GATE.original
    if impl is None:  # the entry is installed only once vLLM's function is known
        raise PatchError(f"{GATE_TARGET} was called before vLLM's function was read")
    return impl


def _gate_entry(*args: Any, **kwargs: Any) -> bool:
    answer = _answering()(*args, **kwargs)
    obs = GATE.observer
    if obs is not None:
        # Under a patch, vLLM's own answer too (cached like it): a patch that never answers
        # differently changed nothing (e2e/rundir/patch_evidence.py). None: no patch answers.
        original = None
        if GATE.impl is not None and GATE.original is not None:
            try:
                original = GATE.original(*args, **kwargs)
            except Exception:  # the original cannot answer here: nothing to compare, never a crash
                original = None
        obs(args, kwargs, answer, original)
    return answer


def _install_gate(mod: Any) -> None:
    """Called when vllm.platforms.rocm is imported (or at once if it is): put the entry in place."""
    if GATE.installed:
        return
    original = getattr(mod, GATE_FUNC, None)
    if original is None:
        raise PatchError(f"{GATE_TARGET} does not exist in vLLM {vllm_version()}")
    GATE.original = original
    if GATE.widened_code is not None and GATE.impl_name == WIDENED_GATE:
        GATE.impl = _materialise_widened(mod)
    # The entry stands for vLLM's cached function: its cache is the answering function's.
    vars(_gate_entry).update(
        original=original, cache_info=lambda: _answering().cache_info(), cache_clear=lambda: _answering().cache_clear()
    )
    setattr(mod, GATE_FUNC, _gate_entry)
    GATE.installed = True


def arm_gate() -> bool:
    """Make sure the gate entry is (or will be) installed. True if the module is imported already."""
    return hooks.when_imported(GATE_MODULE, _install_gate) or GATE.installed


def gate_state() -> dict[str, Any]:
    """For the process record: is the gate module loaded here, and what answers for it."""
    return {
        "target": GATE_TARGET,
        "module_imported": GATE.installed,
        "impl": GATE.impl_name or "original",
        **GATE.widened_detail,
    }


# -- widened-gfx11-gate: the installed source with one comparison changed -----------------------------
def _gate_source_path() -> Path:
    try:
        spec = importlib.util.find_spec(GATE_MODULE)
    except (ImportError, ValueError) as exc:
        raise PatchError(f"widened-gfx11-gate: {GATE_MODULE} not found in vLLM {vllm_version()}: {exc}") from None
    origin = getattr(spec, "origin", None)
    if spec is None or not origin or not origin.endswith(".py"):
        raise PatchError(
            f"widened-gfx11-gate: target {GATE_TARGET} does not exist in vLLM {vllm_version()} "
            f"(no {GATE_MODULE} source)"
        )
    return Path(origin)


def compile_widened(source: str, filename: str, version: str) -> tuple[Any, dict[str, Any]]:
    """Compile the gate function from `source` with `gqa_ratio >= 3` rewritten to `gqa_ratio >= 1`.

    Exactly one such comparison must exist inside the function, else PatchError (the vLLM version
    changed the gate: the patch must be reviewed, not guessed). Line numbers are kept, so tracebacks
    point into the real file. Annotations and decorators are dropped (the caller adds the cache).
    """
    tree = ast.parse(source, filename=filename)
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == GATE_FUNC]
    if len(funcs) != 1:
        raise PatchError(
            f"widened-gfx11-gate: target {GATE_TARGET} does not exist in vLLM {version} "
            f"({filename} defines it {len(funcs)} times)"
        )
    fn = funcs[0]
    hits = [
        c
        for c in ast.walk(fn)
        if isinstance(c, ast.Compare)
        and len(c.ops) == 1
        and isinstance(c.ops[0], ast.GtE)
        and isinstance(c.left, ast.Name)
        and c.left.id == "gqa_ratio"
        and isinstance(c.comparators[0], ast.Constant)
        and c.comparators[0].value == 3
    ]
    if len(hits) != 1:
        raise PatchError(
            f"widened-gfx11-gate: {GATE_TARGET} in vLLM {version} has {len(hits)} "
            f"comparisons 'gqa_ratio >= 3' (expected exactly 1): review the patch"
        )
    line = source.splitlines()[hits[0].lineno - 1].strip()
    hits[0].comparators[0] = ast.copy_location(ast.Constant(1), hits[0].comparators[0])
    fn.decorator_list = []
    fn.returns = None
    for a in fn.args.args + fn.args.kwonlyargs + fn.args.posonlyargs:
        a.annotation = None
    mod = ast.fix_missing_locations(ast.Module(body=[fn], type_ignores=[]))
    code = compile(mod, filename, "exec")
    return code, {"widened_line": hits[0].lineno, "original_text": line, "source": filename}


def build_widened(code: Any, namespace: dict[str, Any]) -> CachedGate:
    """Define the compiled function with `namespace` as its globals; cached like the original."""
    local: dict[str, Any] = {}
    exec(code, namespace, local)  # noqa: S102 - vLLM's own source, one constant changed
    widened = functools.cache(local[GATE_FUNC])
    vars(widened)["_e2e_patch"] = WIDENED_GATE
    return widened


def _materialise_widened(mod: Any) -> CachedGate:
    return build_widened(GATE.widened_code, mod.__dict__)


FORCED = (GATE_ON, GATE_OFF)


def _set_gate_impl(name: str, make: Callable[[], CachedGate | None]) -> None:
    # The two forced answers may replace each other (kernels_check flips them per cell);
    # any other pair of gate patches is a contradiction in the arm's config.
    flip = GATE.impl_name in FORCED and name in FORCED
    if GATE.impl_name not in (None, name) and not flip:
        raise PatchError(f"patches {GATE.impl_name!r} and {name!r} both replace {GATE_TARGET}: pick one")
    GATE.impl_name = name
    GATE.impl = make()


def _forced(answer: bool) -> CachedGate:
    @functools.cache
    def gate(*args: Any, **kwargs: Any) -> bool:
        return answer

    vars(gate)["_e2e_patch"] = GATE_ON if answer else GATE_OFF
    return gate


def _apply_widened(name: str) -> dict[str, Any]:
    path = _gate_source_path()
    if GATE.widened_code is None:
        GATE.widened_code, GATE.widened_detail = compile_widened(path.read_text(), str(path), vllm_version())
    _set_gate_impl(name, lambda: None)  # built from the module's globals once it is imported
    if GATE.installed:
        GATE.impl = _materialise_widened(importlib.import_module(GATE_MODULE))
    return _gate_state_detail()


def _apply_forced(name: str) -> dict[str, Any]:
    if GATE_MODULE not in sys.modules:
        _gate_source_path()  # the target must exist in this vLLM even if the module loads later
    _set_gate_impl(name, lambda: _forced(name == GATE_ON))
    return _gate_state_detail()


def _gate_state_detail() -> dict[str, Any]:
    loaded = arm_gate()
    return {"target": GATE_TARGET, "state": "installed" if loaded else "armed (installs on import)"}


# The built-in patches: name (e2e/plugin/contract.py owns the names) -> applier(name) -> detail.
BUILTIN: dict[str, Callable[[str], dict[str, Any]]] = {
    WIDENED_GATE: _apply_widened,
    GATE_ON: _apply_forced,
    GATE_OFF: _apply_forced,
}


# -- user patches --------------------------------------------------------------------------------
def _apply_user(spec: str) -> dict[str, Any]:
    if not USER_PATCH_FORM.match(spec):
        raise PatchError(f"patch {spec!r}: not a built-in ({', '.join(BUILTIN)}) and not module:function")
    mod_name, func_name = spec.split(":")
    try:
        mod = importlib.import_module(mod_name)
    except ModuleNotFoundError as exc:
        raise PatchError(
            f"patch {spec!r}: module {mod_name!r} is not importable on this server's path "
            f"({exc}); vLLM {vllm_version()}"
        ) from exc
    func = getattr(mod, func_name, None)
    if not callable(func):
        raise PatchError(
            f"patch {spec!r}: target {mod_name}.{func_name} does not exist "
            f"(module {getattr(mod, '__file__', mod_name)}); vLLM {vllm_version()}"
        )
    wraps = _declared(spec, func)
    try:
        result = func()
    except PatchError:
        raise
    except Exception as exc:
        raise PatchError(f"patch {spec!r} failed in vLLM {vllm_version()}: {type(exc).__name__}: {exc}") from exc
    return {
        "target": spec,
        "state": "called",
        "returned": None if result is None else repr(result)[:200],
        "wraps": list(wraps),
    }


def _declared(spec: str, func: Any) -> tuple[str, ...]:
    """The targets a user patch declares it wraps (contract.WRAPS_ATTR), each "module:qualname"."""
    got = getattr(func, WRAPS_ATTR, ())
    got = (got,) if isinstance(got, str) else tuple(got or ())
    bad = [t for t in got if not isinstance(t, str) or not TARGET_FORM.match(t)]
    if bad:
        raise PatchError(f"patch {spec!r}: {WRAPS_ATTR} {bad!r}: name each target as 'module:qualname'")
    return got


APPLIED: dict[str, dict[str, Any]] = {}  # name -> detail, for the process record


def apply_patches(names: list[str] | tuple[str, ...]) -> list[str]:
    """Apply patches in this process, in order; returns the names applied (each at most once).

    Raises PatchError on the first that cannot be applied. Callable in-process without the plugin's
    environment (kernels_check uses ["gate-always-off"] / ["gate-always-on"]).
    """
    done: list[str] = []
    for name in names:
        name = name.strip()
        if not name:
            continue
        if name in FORCED and GATE.impl_name != name:
            APPLIED.pop(name, None)  # flipping back to a forced answer applied earlier
        if name not in APPLIED:
            APPLIED[name] = BUILTIN[name](name) if name in BUILTIN else _apply_user(name)
        done.append(name)
    return done


def _reset_for_tests() -> None:
    """Forget gate patches (unit tests only: the module attribute is not restored)."""
    GATE.impl = GATE.impl_name = None
    GATE.widened_code = None
    GATE.widened_detail = {}
    for n in BUILTIN:
        APPLIED.pop(n, None)
