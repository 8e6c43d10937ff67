"""What a plan costs, and what `--target-ci` adds to it, predicted before anything starts (`run --dry-run`).

Costs are those of the earlier run whose variance model predicts the plan (e2e/analysis/prior.py),
taken as adaptive replication takes them from its pilot (e2e/analysis/adaptive.py pilot_costs): a
warm server start per arm, and per arm and depth the warm-up and one timed round. An arm the earlier
run lacks costs what its dearest arm did. Without an earlier run the stated defaults stand in (those
of pilot_costs: 120 s a start, 1 s a round), and the output says so.

With a target, the plan is the pilot, and the allocation adaptive replication would make after it
(planning.allocate: the extra passes and rounds per depth, within --max-passes and --max-minutes)
is predicted from the same variance components.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.analysis.prior import variance_cells
from e2e.design.config import Config
from e2e.design.plan import Cell
from e2e.design.point import Point
from e2e.errors import UserError
from e2e.stats import planning

DEFAULT_START_S, DEFAULT_WARMUP_S, DEFAULT_ROUND_S = 120.0, 0.0, 1.0  # adaptive.pilot_costs' own fallbacks


@dataclass(frozen=True)
class PlanCost:
    source: str  # where the costs came from
    server_s: float  # the plan's cells: server starts, warm-ups, timed rounds
    servers: int
    gpus_per_server: int
    target: dict[str, Any] | None = None  # --target-ci's predicted allocation (None: no target)

    def gpu_minutes(self, seconds: float | None = None) -> float:
        return (self.server_s if seconds is None else seconds) * self.gpus_per_server / 60


def prior_costs(comp: planning.Components, arms: list[str], points: list[Point]) -> tuple[planning.Costs, str]:
    """The costs of the run `comp` came from, for these arms and points, and a line naming them."""
    folder = Path(comp.source)
    if comp.source != "default" and folder.is_dir():
        from e2e.analysis.adaptive import pilot_costs
        from e2e.analysis.run_analysis import RunAnalysis

        try:
            return _for(pilot_costs(RunAnalysis(folder)), arms, points), f"{folder}'s measured starts and rounds"
        except (UserError, OSError, ValueError, KeyError):
            pass  # an unreadable folder times nothing; the defaults below say so
    start = dict.fromkeys(arms, DEFAULT_START_S)
    warm = {(a, d): DEFAULT_WARMUP_S for a in arms for d in points}
    rnd = {(a, d): DEFAULT_ROUND_S for a in arms for d in points}
    why = f"the stated default ({DEFAULT_START_S:g} s a server start, {DEFAULT_ROUND_S:g} s a round; no earlier run)"
    return planning.Costs(start, warm, rnd), why


def _for(c: planning.Costs, arms: list[str], points: list[Point]) -> planning.Costs:
    """An arm (or point) the earlier run lacks: its dearest arm's cost."""

    def at(table: dict[tuple[str, Point], float], a: str, d: Point, default: float) -> float:
        return table.get((a, d), max((v for (_, e), v in table.items() if e == d), default=default))

    return planning.Costs(
        {a: c.start_s.get(a, max(c.start_s.values(), default=DEFAULT_START_S)) for a in arms},
        {(a, d): at(c.warmup_s, a, d, DEFAULT_WARMUP_S) for a in arms for d in points},
        {(a, d): at(c.round_s, a, d, DEFAULT_ROUND_S) for a in arms for d in points},
    )


def cells_s(costs: planning.Costs, cfg: Config, cells: list[Cell]) -> float:
    """Seconds of server time: a start per server, then each cell's warm-up and rounds."""
    starts = {c.server_key: c.arm for c in cells}
    total = sum(costs.start_s[a] for a in starts.values())
    return total + sum(
        costs.warmup_s[(c.arm, c.point)] + (c.rounds or cfg.workload.rounds) * costs.round_s[(c.arm, c.point)]
        for c in cells
    )


def plan_cost(cfg: Config, cells: list[Cell], comp: planning.Components, widest_pct: float | None = None) -> PlanCost:
    """The plan's cost; with run.target_ci_pct, what adaptive replication is predicted to add
    (widest_pct: the widest predicted interval of the planned passes, None when none is predicted)."""
    arms, points = [a.name for a in cfg.arms], cfg.workload.points
    costs, source = prior_costs(comp, arms, points)
    pilot_s = cells_s(costs, cfg, cells)
    out = PlanCost(source, pilot_s, len({c.server_key for c in cells}), cfg.server.tensor_parallel_size)
    target = cfg.run.target_ci_pct
    if target is None:
        return out
    passes = len({c.pass_ for c in cells})
    t: dict[str, Any] = {"target_pct": target, "pilot_passes": passes, "widest_pct": widest_pct}
    cap = cfg.run.max_passes - passes
    budget = None if cfg.run.max_minutes is None else max(0.0, cfg.run.max_minutes * 60 - pilot_s)
    if widest_pct is None or len(arms) < 2:
        t["outcome"] = "nothing to predict (no interval from the planned passes)"
    elif widest_pct <= target:
        t["outcome"] = "reached by the planned passes: none added"
    elif cap < 1:
        t["outcome"] = f"not reached, and max passes {cfg.run.max_passes} leaves no pass to add"
    else:
        shared = cfg.server.mode == "per-arm-pass"
        alloc = planning.allocate(
            comp, variance_cells(cfg, cells), arms, points, shared, costs, target, cap, max_cost_s=budget
        )
        widest = max(alloc.predicted_half_width_pct.values(), default=None)
        t.update(extra_passes=alloc.extra_passes, rounds=alloc.rounds, extra_s=alloc.predicted_s, predicted_pct=widest)
        t["outcome"] = (
            "reached"
            if alloc.met
            else f"not reached within max passes {cfg.run.max_passes}"
            + (f" / max minutes {cfg.run.max_minutes:g}" if cfg.run.max_minutes is not None else "")
        )
    return PlanCost(out.source, out.server_s, out.servers, out.gpus_per_server, t)
