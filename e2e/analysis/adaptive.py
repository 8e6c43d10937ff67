"""Adaptive replication's decision: from the pilot's rows to the extra passes and rounds per depth.

session._replicate runs the pilot (the planned passes), asks plan_extra what to add, runs it, and
records decision.outcome(). The choice is e2e/planning.allocate's, fed with the pilot's variance
model (e2e/stats/variance_model.py) and the pilot's measured costs: a warm server start per arm (the
first start of an arm fills its compile cache and is left out when a later one exists), and per
arm and depth the warm-up and one timed round. One look only (see session._replicate), and the
second stage always runs, at least its minimum (one more pass at the fewest rounds that meet the
target): a pilot whose intervals looked narrow enough was a stop on the data, and runs that stopped
there covered 82.5 % in a harder simulated regime. The pilot can shorten the second stage, never
skip it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.design.point import Point
from e2e.stats import planning

STOP_PILOT, STOP_ONE_ARM, STOP_NO_MODEL = (
    "target reached by the pilot: the second stage runs its minimum",
    "nothing to compare (one arm)",
    "no variance model from the pilot (fewer than 2 servers per arm)",
)
STOP_PLANNED, STOP_CAPPED = "the allocation that reaches the target", "the allocation capped by max passes / minutes"


def _median(xs: list[float], default: float) -> float:
    xs = [x for x in xs if x is not None and x > 0]
    return float(statistics.median(xs)) if xs else default


def pilot_costs(a: Any) -> planning.Costs:
    """Seconds per warm start (per arm), warm-up and round (per arm and point) from a RunAnalysis."""
    ok = sorted((c for c in a.cell_rows.values() if c.get("status") == "ok"), key=lambda c: c.get("index", 0))
    every_start = [float(c["startup_s"]) for c in ok if c.get("startup_s")]
    start, warm, rnd = {}, {}, {}
    for arm in a.arms:
        starts = [float(c["startup_s"]) for c in ok if c["arm"] == arm and c.get("startup_s")]
        start[arm] = _median(starts[1:] or starts, _median(every_start, 120.0))
        for d in a.points:
            cs = [c for c in ok if c["arm"] == arm and Point.of(c) == d]
            warm[(arm, d)] = _median([c.get("warmup_s") for c in cs], 0.0) if cs else 0.0
            rnd[(arm, d)] = _median(
                [float(c["measure_s"]) / c["rounds"] for c in cs if c.get("measure_s") and c.get("rounds")], 1.0
            )
    return planning.Costs(start, warm, rnd)


@dataclass
class Decision:
    target_ci_pct: float
    pilot_passes: int
    max_passes: int
    max_minutes: float | None
    stopped_by: str
    extra_passes: int = 0
    rounds: dict[Point, int] = field(default_factory=dict)
    pilot_widest_pct: float | None = None
    allocation: dict[str, Any] | None = None
    costs: dict[str, Any] | None = None
    limit: str | None = None

    def summary(self) -> str:
        if not self.extra_passes:
            return f"{self.pilot_passes} pilot passes, no more: {self.stopped_by}"
        r = ", ".join(f"{d}: {n}" for d, n in sorted(self.rounds.items()))
        pred = (self.allocation or {}).get("predicted_gpu_minutes")
        cmp = ">" if (self.pilot_widest_pct or 0.0) > self.target_ci_pct else "<="
        return (
            f"pilot widest +-{self.pilot_widest_pct:.2f} % {cmp} {self.target_ci_pct:g} %: {self.extra_passes} more "
            f"pass(es), rounds per point {r}, predicted {pred:.1f} GPU-min ({self.stopped_by})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": "two-stage: a pilot, then one allocation from the pilot's variance model and costs, "
            "always run (at least one more pass)",
            "target_ci_pct": self.target_ci_pct,
            "pilot_passes": self.pilot_passes,
            "max_passes": self.max_passes,
            "max_minutes": self.max_minutes,
            "stopped_by": self.stopped_by,
            "limit": self.limit,
            "extra_passes": self.extra_passes,
            "rounds": {str(d): n for d, n in self.rounds.items()},
            "passes": self.pilot_passes + self.extra_passes,
            "pilot_widest_ci_half_width_pct": self.pilot_widest_pct,
            "allocation": self.allocation,
            "costs": self.costs,
        }

    def outcome(self, run_dir: Path) -> dict[str, Any]:
        return with_outcome(self.to_dict(), run_dir)


def with_outcome(replication: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """A decision's record plus what the second stage achieved (the report's figures, from the rows)."""
    from e2e.analysis.run_analysis import RunAnalysis

    a = RunAnalysis(run_dir)
    widths = [
        c["ci_half_width_pct"]
        for c in a.comparisons
        if c["scope"] == "pooled" and c["ci_half_width_pct"] is not None and c.get("p_value") is not None
    ]
    widest = max(widths) if widths else None
    return {
        **replication,
        "passes": max(a.passes, default=0),
        "widest_ci_half_width_pct": widest,
        "target_met": widest is not None and widest <= replication["target_ci_pct"],
    }


def plan_extra(cfg: Any, run_dir: Path, passes: int, elapsed_min: float) -> Decision:
    """What to add after the pilot (see the module docstring)."""
    from e2e.analysis.run_analysis import RunAnalysis

    r = cfg.run
    a = RunAnalysis(run_dir)
    dec = Decision(r.target_ci_pct, passes, r.max_passes, r.max_minutes, STOP_PILOT)
    pooled = [c for c in a.comparisons if c["scope"] == "pooled"]
    if not pooled:
        dec.stopped_by = STOP_ONE_ARM
        return dec
    widths = [c["ci_half_width_pct"] for c in pooled if c.get("p_value") is not None]
    if a.fit is None or len(widths) < len(pooled) or any(w is None for w in widths):
        dec.stopped_by = STOP_NO_MODEL
        return dec
    dec.pilot_widest_pct = max(widths)
    costs = pilot_costs(a)
    dec.costs = {
        "start_s": costs.start_s,
        "warmup_s": {f"{k[0]}@{k[1]}": v for k, v in costs.warmup_s.items()},
        "round_s": {f"{k[0]}@{k[1]}": v for k, v in costs.round_s.items()},
    }
    cap = r.max_passes - passes
    dec.limit = f"max passes {r.max_passes}"
    left_s = None
    if r.max_minutes is not None:
        left_s = max(0.0, (r.max_minutes - elapsed_min) * 60)
        dec.limit += f", max minutes {r.max_minutes:g} ({left_s / 60:.1f} left after the pilot)"
    if cap < 1:
        dec.stopped_by = STOP_CAPPED
        return dec
    alloc = planning.allocate(
        planning.Components.of(a.fit),
        list(a.fit.design.cells),
        a.arms,
        a.points,
        a.shared_servers,
        costs,
        r.target_ci_pct,
        cap,
        max_cost_s=left_s,
    )
    dec.allocation = alloc.to_dict()
    dec.extra_passes, dec.rounds = alloc.extra_passes, dict(alloc.rounds)
    reached = dec.pilot_widest_pct <= r.target_ci_pct
    dec.stopped_by = STOP_PILOT if reached and alloc.met else STOP_PLANNED if alloc.met else STOP_CAPPED
    return dec
