"""A run's kernel profiles as its summary holds them (summary.json's `profile`, e2e/report/summary.py):
per point, where the decode step goes per arm (groups and top kernels, ms per step and share), and per
comparison what differs, attributed to kernels up to the measured difference. Also the kernel
difference between two runs' arms that `compare` and `history` carry. Pure apart from reading the run
folder's profiles.jsonl."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from e2e.design.point import Point
from e2e.profile import steps
from e2e.rundir.manifest_model import RecordedConfig
from e2e.rundir.store import profiles_of


def by_arm_point(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, Point], dict[str, Any]]:
    """(arm, point) -> its cells' profiles as one (steps.mean_profile), or {"status": "missing",
    "reasons": [...]} when no cell of it has one. A cell profiled twice (resumed) counts once: its last."""
    last: dict[str, Mapping[str, Any]] = {}
    for r in rows:
        last[r["cell_id"]] = r
    ok: dict[tuple[str, Point], list[Mapping[str, Any]]] = defaultdict(list)
    why: dict[tuple[str, Point], list[str]] = defaultdict(list)
    for r in last.values():
        key = (r["arm"], Point.of(r))
        if r["status"] == "ok":
            ok[key].append(r)
        else:
            why[key].append(f"{r['cell_id']}: {r.get('reason')}")
    out: dict[tuple[str, Point], dict[str, Any]] = {}
    for key in set(ok) | set(why):
        out[key] = (
            {"status": "ok", **steps.mean_profile(ok[key]), "missing": why[key]}
            if ok[key]
            else {"status": "missing", "reasons": why[key]}
        )
    return out


def off_reason(config: RecordedConfig, arm: str) -> str | None:
    """Why an arm was not profiled by its config, or None."""
    if config.profile is not None and not config.profile.enabled:
        return "profiling off (profile.enabled = false / --no-profile)"
    for a in config.arms:
        if a.name == arm and a.profile is False:
            return f"arms.{arm}.profile = false"
    return None


def summarise(
    root: Path, config: RecordedConfig, arms: list[str], points: list[Point], comparisons: list[Mapping[str, Any]]
) -> dict[str, Any] | None:
    """summary.json's `profile`; None for a run folder whose harness took no profiles (no profile
    section in its config, no profiles.jsonl): its report says so in one line, from the absence."""
    rows = profiles_of(root)
    if config.profile is None and not rows:
        return None
    profiles = by_arm_point(rows)
    measured = {(c["arm"], Point.of(c)): c.get("diff_ms") for c in comparisons if c.get("scope") == "pooled"}
    out_points = []
    for p in points:
        per_arm = []
        for arm in arms:
            prof = profiles.get((arm, p))
            if prof is None:
                per_arm.append(
                    {"arm": arm, "status": "missing", "reason": off_reason(config, arm) or "no profile recorded"}
                )
            elif prof["status"] != "ok":
                per_arm.append({"arm": arm, "status": "missing", "reason": "; ".join(prof["reasons"])})
            else:
                per_arm.append(
                    {"arm": arm, "status": "ok", "source": prof["source"], "cells": prof["cells"], **steps.shares(prof)}
                )
        diffs = []
        ref = arms[0] if arms else None
        for arm in arms[1:]:
            a, r = profiles.get((arm, p)), profiles.get((ref, p)) if ref else None
            if a and r and a["status"] == "ok" and r["status"] == "ok":
                diffs.append({"arm": arm, "reference": ref, **steps.difference(a, r, measured.get((arm, p)))})
        out_points.append({**p.fields(), "arms": per_arm, "differences": diffs})
    return {"points": out_points}


def attention_share(point: Mapping[str, Any]) -> str:
    """One line for a point: attention's share of the decode step per arm (the PR block's)."""
    parts = []
    for a in point["arms"]:
        if a["status"] != "ok":
            parts.append(f"{a['arm']} no profile")
            continue
        g = next(x for x in a["groups"] if x["group"] == "attention")
        share = "-" if g["share"] is None else f"{100 * g['share']:.0f} %"
        parts.append(f"{a['arm']} {share} ({g['ms']:.3g} of {a['step_ms']:.3g} ms)")
    return ", ".join(parts)


def between_runs(
    a_root: Path, b_root: Path, arm: str, point: Point, measured_ms: float | None
) -> dict[str, Any] | None:
    """What moved between run A and run B for one arm at one point (B minus A), attributed to kernels;
    None when either run has no profile there."""
    pa = by_arm_point(profiles_of(a_root)).get((arm, point))
    pb = by_arm_point(profiles_of(b_root)).get((arm, point))
    if not pa or not pb or pa["status"] != "ok" or pb["status"] != "ok":
        return None
    return steps.difference(pb, pa, measured_ms)
