"""The names the harness and the plugin agree on, defined once. Standard library only: this module
is imported by the harness (launch.py, config.py, routing.py) and inside every vLLM process.

Environment the harness sets for a server and the plugin reads (launch.plugin_env):
    E2E_PLUGIN=1          switch the plugin on (off otherwise: installing the project changes nothing)
    E2E_ARM=<name>        the arm, recorded in every process's record
    E2E_PATCHES=a,b       patches to apply (built-in names or module:function)
    E2E_RECORD_DIR=<dir>  where each process writes <role>-<pid>.json atomically
    E2E_ROUTING_MODE      aggregate (default) | per-step | off; set it in the arm's or server's env
    E2E_FLUSH_S           seconds between record flushes (default 1)
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

ENV_ON = "E2E_PLUGIN"
ENV_ARM = "E2E_ARM"
ENV_PATCHES = "E2E_PATCHES"
ENV_RECORD_DIR = "E2E_RECORD_DIR"
ENV_ROUTING_MODE = "E2E_ROUTING_MODE"
ENV_FLUSH_S = "E2E_FLUSH_S"

ROUTING_MODES = ("aggregate", "per-step", "off")
DEFAULT_ROUTING_MODE = "aggregate"

# Entry point (group vllm.general_plugins) and the shim distribution that declares it.
PLUGIN_NAME = "e2e_arms"
ENTRY_POINT = f"{PLUGIN_NAME} = e2e.plugin:register"
# Same distribution name as the installed project: importlib.metadata keeps one distribution per
# name (the first on sys.path), so where the project is also installed the plugin still loads once.
SHIM_DIST = "vllm_e2e_bench"

# What one process's record says it is (e2e/plugin/recorder.py writes it, e2e/rundir/routing.py reads it).
# /2 adds `patched_calls` (the calls of each patched function, and for a gate its differing answers).
RECORD_SCHEMA = "e2e-plugin-record/2"
RECORD_SCHEMA_PREFIX = "e2e-plugin-record/"

# Built-in patches, name -> what it does. The appliers are e2e/plugin/patches.py's registry (a test
# checks that both name the same set). Anything else must be a user patch "module:function".
WIDENED_GATE = "widened-gfx11-gate"
GATE_ON = "gate-always-on"
GATE_OFF = "gate-always-off"
BUILTIN_PATCHES = {
    WIDENED_GATE: "the gfx11/gfx12 branch of use_rocm_custom_paged_attention with gqa_ratio >= 1 "
    "instead of >= 3 (vllm#54210), rebuilt from the installed source",
    GATE_ON: "the ROCm custom paged-attention gate answers True",
    GATE_OFF: "the ROCm custom paged-attention gate answers False",
}
USER_PATCH_FORM = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")

# What each patch changes, so a run can tell an arm that changed nothing (e2e/rundir/patch_evidence.py).
# A target is "module:qualname". A gate's wrapper asks vLLM's original too, so its differing answers count.
GATE_FUNCTION = "vllm.platforms.rocm:use_rocm_custom_paged_attention"
BUILTIN_TARGETS = {WIDENED_GATE: (GATE_FUNCTION,), GATE_ON: (GATE_FUNCTION,), GATE_OFF: (GATE_FUNCTION,)}
GATES = frozenset({GATE_FUNCTION})  # targets whose original answer is recorded beside the patched one
# A user patch declares what it wraps as this attribute of its function (a list of "module:qualname"),
# set by hand or by the decorator below; without it the arm cannot be checked for being inert.
WRAPS_ATTR = "e2e_wraps"
TARGET_FORM = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def wraps(*targets: str) -> Callable[[F], F]:
    """Decorator for a user patch function: the functions ("module:qualname") it replaces or wraps.

    from e2e.plugin.contract import wraps

    @wraps("vllm.v1.attention.ops.chunked_prefill_paged_decode:chunked_prefill_paged_decode")
    def apply(): ...
    """
    bad = [t for t in targets if not isinstance(t, str) or not TARGET_FORM.match(t)]
    if bad or not targets:
        raise ValueError(f"wraps{targets!r}: name each target as 'module:qualname'")

    def mark(fn: F) -> F:
        setattr(fn, WRAPS_ATTR, tuple(targets))
        return fn

    return mark


def patch_form_problem(name: str) -> str | None:
    """Why a patch name is neither a built-in nor module:function, or None."""
    if name in BUILTIN_PATCHES or USER_PATCH_FORM.match(name):
        return None
    return f"unknown patch {name!r}: use a built-in ({', '.join(BUILTIN_PATCHES)}) or module:function"
