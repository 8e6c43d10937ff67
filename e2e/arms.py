"""Harness side of arms: the environment that switches the plugin on for one server, and the
folding of the per-process records the plugin writes back into the cell row.

Contract with e2e/plugin (which runs inside vLLM and imports nothing from the harness):
    E2E_PLUGIN=1          switch the plugin on (off otherwise: installing the project changes nothing)
    E2E_ARM=<name>        the arm, recorded in every process's record
    E2E_PATCHES=a,b       patches to apply (built-in names or module:function)
    E2E_RECORD_DIR=<dir>  where each process writes <role>-<pid>.json atomically
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from e2e.config import ArmCfg, Config


def plugin_env(arm: ArmCfg, record_dir: Path, cfg: Config) -> dict[str, str]:
    return {"E2E_PLUGIN": "1", "E2E_ARM": arm.name, "E2E_PATCHES": ",".join(arm.patches),
            "E2E_RECORD_DIR": str(record_dir)}


def read_records(record_dir: Path) -> list[dict[str, Any]]:
    out = []
    for p in sorted(Path(record_dir).glob("*.json")):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, json.JSONDecodeError):
            continue  # a record being replaced right now; the atomic rename makes this rare
    return out


def fold_records(record_dir: Path, arm: ArmCfg) -> dict[str, Any]:
    recs = read_records(record_dir)
    return {"n_processes": len(recs),
            "processes": [{k: r.get(k) for k in ("role", "rank", "pid", "patches_applied")} for r in recs]}


def patch_problem(routing: dict[str, Any], arm: ArmCfg) -> str | None:
    """Why the cell cannot be trusted to have run the arm's patches, or None."""
    if not arm.patches:
        return None
    missing = [p for p in routing.get("processes", [])
               if not set(arm.patches) <= set(p.get("patches_applied") or [])]
    if not routing.get("processes"):
        return f"no plugin records arrived: patches {list(arm.patches)} not proven applied"
    if missing:
        return f"patches {list(arm.patches)} not applied in {[m['role'] for m in missing]}"
    return None
