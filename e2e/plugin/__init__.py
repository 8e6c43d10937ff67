"""The project's vLLM general plugin: arms and routing records inside every vLLM process.

vLLM calls `register()` (entry point `e2e_arms`, group `vllm.general_plugins`) in the API server,
the engine core and every worker, before model load and graph capture. It does nothing unless
E2E_PLUGIN=1. Then it reads the environment named in e2e/plugin/contract.py (set by
e2e/serve/launch.py): the arm, its patches, the record folder, the routing mode, the flush interval.

A patch that cannot be applied raises from register(): vLLM's load_general_plugins does not catch
exceptions of the plugin function (0.26 and 0.32), so the process - and the server start - fails,
with "e2e plugin:" and the target and vLLM version in the message (also printed to stderr and
written into the record, for the log tail and the harness).

Imports only the standard library and vLLM: this runs inside vLLM's environment.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from e2e.plugin.recorder import Recorder

_state: dict[str, Any] = {}


def _plugin_dist() -> str | None:
    """Where the entry point that loaded us was declared (installed dist-info or the arms shim)."""
    try:
        from importlib.metadata import entry_points

        for ep in entry_points(group="vllm.general_plugins"):
            if ep.value.startswith("e2e.plugin"):
                dist = getattr(ep, "dist", None)
                return str(getattr(dist, "_path", None) or getattr(dist, "name", None))
    except Exception as exc:
        return f"unknown ({exc!r})"
    return None


def register() -> None:
    """vLLM general-plugin entry point. Idempotent within a process."""
    from e2e.plugin import contract as pc

    if os.environ.get(pc.ENV_ON) != "1" or _state.get("registered"):
        return
    _state["registered"] = True
    from e2e.plugin import instrument, patches, recorder

    mode = os.environ.get(pc.ENV_ROUTING_MODE, pc.DEFAULT_ROUTING_MODE) or pc.DEFAULT_ROUTING_MODE
    record_dir = os.environ.get(pc.ENV_RECORD_DIR) or None
    rec = recorder.Recorder(
        Path(record_dir) if record_dir else None,
        os.environ.get(pc.ENV_ARM, ""),
        mode if mode in pc.ROUTING_MODES else pc.DEFAULT_ROUTING_MODE,
        float(os.environ.get(pc.ENV_FLUSH_S) or 1.0),
    )
    _state["recorder"] = rec
    requested = [p.strip() for p in os.environ.get(pc.ENV_PATCHES, "").split(",") if p.strip()]
    rec.extra.update(
        {
            "vllm_version": patches.vllm_version(),
            "plugin_file": __file__,
            "plugin_dist": _plugin_dist(),
            "patches_requested": requested,
            "patches_applied": [],
            "patch_details": {},
            "error": None,
        }
    )
    if mode not in pc.ROUTING_MODES:
        _fail(rec, f"{pc.ENV_ROUTING_MODE}={mode!r}: use one of {', '.join(pc.ROUTING_MODES)}")
    if mode != "off":
        instrument.install(rec)
    try:
        for name in requested:
            patches.apply_patches([name])
            rec.extra["patches_applied"].append(name)
            rec.extra["patch_details"][name] = patches.APPLIED[name]
        if mode != "off":  # what the patches change, counted (routing off: nothing is, nor judged)
            instrument.watch_patched(rec, patched_functions(requested, rec.extra["patch_details"]))
    except Exception as exc:
        _fail(rec, str(exc) if isinstance(exc, patches.PatchError) else f"{type(exc).__name__}: {exc}", exc)
    rec.write()
    rec.start_flushing()


def patched_functions(names: list[str], details: dict[str, Any]) -> list[str]:
    """The functions ("module:qualname") the named patches change: a built-in's own, a user patch's
    declared ones (its detail's "wraps")."""
    from e2e.plugin.contract import BUILTIN_TARGETS

    out: list[str] = []
    for n in names:
        out += BUILTIN_TARGETS.get(n) or (details.get(n) or {}).get("wraps") or []
    return list(dict.fromkeys(out))


def _fail(rec: Recorder, message: str, cause: BaseException | None = None) -> NoReturn:
    role = f"{rec.role} pid {rec.pid}"
    msg = f"e2e plugin: {message} [{role}, arm {rec.arm!r}]"
    rec.extra["error"] = msg
    try:
        rec.write(final=True)
    finally:
        print(msg, file=sys.stderr, flush=True)
    raise RuntimeError(msg) from cause


def current_recorder() -> Recorder | None:
    """This process's recorder, or None when the plugin is off (for tests and kernels_check)."""
    rec: Recorder | None = _state.get("recorder")
    return rec
