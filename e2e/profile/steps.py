"""From two profiled rounds to a decode step, as the timing differences them: (long - short) /
(long_tokens - short_tokens) per kernel, so the prefill, the first token and everything a request
pays once cancel, exactly as in the latency estimate (e2e/stats/estimate.py). Then the step per group
(groups.py), and what differs between two arms' steps, attributed to kernels.

Pure: totals in, plain dicts out (what a profiles.jsonl row holds, e2e/rundir/formats.py ProfileRow)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from e2e.profile.groups import GROUPS, group_of
from e2e.profile.trace import Totals

TOP = 8  # kernels named in the report per arm and per difference; the rest are summed as "other kernels"


def per_step(long: Totals, short: Totals, long_tokens: int, short_tokens: int) -> dict[str, Any]:
    """Per kernel: calls and microseconds per decode step; per group: microseconds per step; the step's
    total. A kernel in one round only counts as zero in the other. Kernels whose difference is nil
    (calls and time) are left out: they ran once per request, not per step."""
    steps = long_tokens - short_tokens
    kernels: list[dict[str, Any]] = []
    for name in sorted(set(long.us) | set(short.us)):
        calls = (long.calls.get(name, 0) - short.calls.get(name, 0)) / steps
        us = (long.us.get(name, 0.0) - short.us.get(name, 0.0)) / steps
        if calls == 0 and abs(us) < 1e-9:
            continue
        kernels.append({"name": name, "group": group_of(name), "calls_per_step": calls, "us_per_step": us})
    kernels.sort(key=lambda k: -k["us_per_step"])
    return {"source": long.source, "steps": steps, "kernels": kernels, **step_groups(kernels)}


def step_groups(kernels: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Microseconds per step per group (GROUPS order) and the step's total."""
    groups = dict.fromkeys(GROUPS, 0.0)
    for k in kernels:
        groups[k["group"]] += k["us_per_step"]
    return {"groups_us": groups, "step_us": sum(groups.values())}


def mean_profile(rows: list[Mapping[str, Any]]) -> dict[str, Any]:
    """Several cells' profiles of one arm and point (its passes) as one: each kernel's mean."""
    n = len(rows)
    acc: dict[str, dict[str, Any]] = {}
    for r in rows:
        for k in r["kernels"]:
            a = acc.setdefault(
                k["name"], {"name": k["name"], "group": k["group"], "calls_per_step": 0.0, "us_per_step": 0.0}
            )
            a["calls_per_step"] += k["calls_per_step"] / n
            a["us_per_step"] += k["us_per_step"] / n
    kernels = sorted(acc.values(), key=lambda k: -k["us_per_step"])
    return {"source": rows[0].get("source"), "cells": n, "kernels": kernels, **step_groups(kernels)}


def shares(p: Mapping[str, Any]) -> dict[str, Any]:
    """A profile's groups and top kernels as ms per step and share of the profiled step."""
    total = p["step_us"]

    def share(us: float) -> float | None:
        return us / total if total > 0 else None

    return {
        "step_ms": total / 1000,
        "groups": [{"group": g, "ms": us / 1000, "share": share(us)} for g, us in p["groups_us"].items()],
        "top": [
            {
                "name": k["name"],
                "group": k["group"],
                "calls_per_step": k["calls_per_step"],
                "ms": k["us_per_step"] / 1000,
                "share": share(k["us_per_step"]),
            }
            for k in p["kernels"][:TOP]
        ],
    }


def difference(arm: Mapping[str, Any], ref: Mapping[str, Any], measured_ms: float | None) -> dict[str, Any]:
    """What differs between two arms' steps: the kernels whose per-step time differs most (by size),
    the rest of the kernels summed, and the part of the measured difference (ms per step, from the
    timing) that no kernel carries: host time, gaps between kernels, or the profile's own noise."""
    a = {k["name"]: k for k in arm["kernels"]}
    r = {k["name"]: k for k in ref["kernels"]}
    deltas = []
    for name in set(a) | set(r):
        d = (a[name]["us_per_step"] if name in a else 0.0) - (r[name]["us_per_step"] if name in r else 0.0)
        group = (a.get(name) or r[name])["group"]
        deltas.append({"name": name, "group": group, "ms": d / 1000})
    deltas.sort(key=lambda x: (-abs(x["ms"]), x["name"]))
    kernels_ms = sum(x["ms"] for x in deltas)
    top = [x for x in deltas[:TOP] if x["ms"] != 0]  # a kernel that did not move is not "what differs"
    out: dict[str, Any] = {
        "top": top,
        "other_kernels_ms": kernels_ms - sum(x["ms"] for x in top),
        "kernels_ms": kernels_ms,
        "measured_ms": measured_ms,
        "not_in_profile_ms": None if measured_ms is None else measured_ms - kernels_ms,
        "groups_ms": {g: (arm["groups_us"][g] - ref["groups_us"][g]) / 1000 for g in GROUPS},
    }
    return out
