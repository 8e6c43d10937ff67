"""Where the cells ran: the executors the manifest records, and per slot its cells and the slot effect.

An executor that places cells on slots records them in its manifest entry (`slots`, and a per-host
cap `max_per_host`), and each cell row names its `slot`; the report decides from that record alone,
never from an executor's name. Rows without a slot ran in the harness's own process ("local").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

from e2e.design.point import Point
from e2e.stats import cells as stats


def concurrency(manifest: dict[str, Any], cell_rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Which executors ran the cells, on how many recorded slots, and the most cells that ran at once."""
    entries = manifest.get("executors") or [{"kind": "local", "max_at_once": 1}]
    at_once = [int(c["at_once"]) for c in cell_rows if c.get("at_once")]
    return {
        "executors": [e.get("kind") for e in entries],
        # the cluster's address, from the entry that recorded one (the key predates other executors)
        "ray_address": next((e["address"] for e in entries if e.get("address")), None),
        "n_slots": max((len(e.get("slots") or []) for e in entries), default=0),
        "hosts": len({s.get("host") for e in entries for s in e.get("slots") or []}),
        "max_per_host_cap": max((int(e["max_per_host"]) for e in entries if e.get("max_per_host")), default=1),
        "max_at_once": max([1] + [int(e.get("max_at_once") or 1) for e in entries]),
        "max_at_once_per_host": max([1] + at_once),
    }


def slot_table(
    cell_rows: Iterable[dict[str, Any]], cells: dict[tuple[str, Point, int], stats.CellStats], alpha: float
) -> tuple[dict[str, Any], list[str]]:
    """Per slot: cells, arms, and the slot effect (slot_effect), with the warnings a reader needs: a
    slot effect, and arms that ran unevenly over the slots (then the slot effect can lean on a ratio).
    cells: (arm, point, pass) -> the statistics of each finished cell."""
    rows_in = list(cell_rows)
    rows = []
    for c in rows_in:
        if c.get("status") != "ok":
            continue
        cs = cells.get((c["arm"], Point.of(c), c["pass"]))
        if cs is not None and cs.estimate and cs.estimate > 0:
            rows.append((c.get("slot") or "local", f"{c['arm']}@{Point.of(c)}", cs.estimate))
    eff = slot_effect(rows)
    hosts = {c.get("slot") or "local": c.get("slot_host") or "this host" for c in rows_in}
    counts: dict[str, dict[str, int]] = {}
    for slot, unit, _ in rows:
        counts.setdefault(unit, {s: 0 for s in eff["per_slot"]})[slot] += 1
    uneven = {u: c for u, c in counts.items() if len(eff["per_slot"]) > 1 and len(set(c.values())) > 1}
    warnings = []
    if uneven:
        u, c = next(iter(uneven.items()))
        warnings.append(
            f"arms not balanced over the slots as run ({len(uneven)} arm-depth(s)): {u} ran "
            f"{'/'.join(str(v) for v in c.values())} times on {'/'.join(c)}: a slot effect "
            "can lean on the ratios"
        )
    if eff["p_value"] is not None and eff["p_value"] < alpha:
        worst = max(eff["per_slot"].items(), key=lambda kv: abs(kv[1]["mean_dev_pct"] or 0))
        warnings.append(
            f"slot effect: cells on {worst[0]} ran {worst[1]['mean_dev_pct']:+.1f} % from "
            f"their arm and depth's mean (F test over slots, p = {eff['p_value']:.3g}); "
            "balanced arms keep it out of the ratios, not out of their intervals"
        )
    for slot, info in eff["per_slot"].items():
        info["host"] = hosts.get(slot)
        info["arms"] = dict(sorted(Counter(u.split("@")[0] for sl, u, _ in rows if sl == slot).items()))
    return {**eff, "balanced_as_run": not uneven, "counts": counts}, warnings


def slot_effect(rows: list[tuple[str, str, float]]) -> dict[str, Any]:
    """rows: (slot, unit, estimate ms), a unit being an arm at a depth. The slot effect as the F test
    of the slot terms in the additive model log(estimate) ~ unit + slot (least squares, so an uneven
    design is tested right too); per slot, its cells' mean deviation from their unit's mean (%)."""
    slots = sorted({r[0] for r in rows})
    units = sorted({r[1] for r in rows})
    y = np.log([r[2] for r in rows]) if rows else np.zeros(0)
    mean = {u: float(np.mean([v for (s, uu, _), v in zip(rows, y) if uu == u])) for u in units}
    per = {
        s: {
            "n_cells": sum(1 for r in rows if r[0] == s),
            "mean_dev_pct": float(100 * np.mean([v - mean[u] for (sl, u, _), v in zip(rows, y) if sl == s])),
        }
        for s in slots
    }
    p = None
    if len(slots) > 1:
        base = np.array([[1.0 if r[1] == u else 0.0 for u in units] for r in rows])
        full = np.hstack([base, np.array([[1.0 if r[0] == s else 0.0 for s in slots[1:]] for r in rows])])
        rss = []
        for X in (base, full):
            beta = np.linalg.lstsq(X, y, rcond=None)[0]
            rss.append((float(np.sum((y - X @ beta) ** 2)), len(y) - np.linalg.matrix_rank(X)))
        (rss_r, df_r), (rss_f, df_f) = rss
        if df_f > 0 and df_r > df_f and rss_f > 0:
            fstat = ((rss_r - rss_f) / (df_r - df_f)) / (rss_f / df_f)
            p = float(scipy_stats.f.sf(fstat, df_r - df_f, df_f))
    return {"per_slot": per, "p_value": p, "test": "F test of slot in log(estimate) ~ arm x depth + slot"}
