"""A cell row's GPU state as readers need it (the run folder's side of e2e/gpu/gpu_state.py): where an
attempt's readings lie, what the verdict layer needs from a row, and the one line naming foreign
processes. Pure reading: no NVML, no process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

VOIDED = "voided.json"  # cells/<server>/gpu-a<n>/: the attempt retry voided, and why


def describe(procs: list[dict[str, Any]]) -> str:
    """'GPU 0: pid 812 (python3, 2048 MiB)', one line for the console and the error text."""

    def one(p: dict[str, Any]) -> str:
        what = [p.get("name") or ("not visible here" if not p.get("visible", True) else "?")]
        if p.get("used_mib") is not None:
            what.append(f"{p['used_mib']:.0f} MiB")
        return f"GPU {p.get('gpu')}: pid {p['pid']} ({', '.join(what)})"

    return "; ".join(one(p) for p in procs)


def cell_summary(row: dict[str, Any]) -> dict[str, Any]:
    """What the verdict layer needs from a cell row: was its GPU exclusive, was it throttled.
    `counted_contaminated`: an ok cell measured beside a foreign process (--gpu-exclusive warn), which
    a verdict must never take in silently. Under retry and fail such an attempt never gets an ok row."""
    g = row.get("gpu_state")
    if not g:
        return {
            "available": False,
            "contaminated": False,
            "counted_contaminated": False,
            "throttled_rounds": [],
            "foreign_pids": [],
            "note": "GPU state not recorded (a run before it was)",
        }
    foreign_ = g.get("foreign") or []
    note = None
    if g.get("contaminated"):
        note = f"contaminated: {describe(foreign_)}" + (
            f" (counted: --gpu-exclusive {g.get('policy')})" if row.get("status") == "ok" else ""
        )
    elif g.get("throttled_rounds"):
        note = f"throttled in round(s) {', '.join(map(str, g['throttled_rounds']))}"
    elif not g.get("available"):
        note = f"no GPU state: {g.get('reason')}"
    return {
        "available": bool(g.get("available")),
        "contaminated": bool(g.get("contaminated")),
        "counted_contaminated": bool(g.get("contaminated")) and row.get("status") == "ok",
        "throttled_rounds": list(g.get("throttled_rounds") or []),
        "foreign_pids": [p["pid"] for p in foreign_],
        "note": note,
    }


def samples_file(run_root: Path, row: dict[str, Any]) -> Path:
    """Where a cell row's attempt left its readings: cells/<server_key>/gpu-a<n>/samples.jsonl."""
    n = str(row["attempt"]).split("-", 1)[0]
    return Path(run_root) / "cells" / str(row.get("server_key") or row["cell_id"]) / f"gpu-a{n}" / "samples.jsonl"
