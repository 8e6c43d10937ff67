"""Planning figures that agree with the verdict. Pure, no I/O.

Every figure here is computed for the decision rule of e2e/stats/verdicts.py as it is applied, not for
a textbook test:

* power(delta): the probability that a true log change delta is called "slower" (or "faster"):
  the two-sided t test at the family's step alpha (Holm's strictest, alpha / m) rejects AND the
  estimated ratio is at least min_effect away from 1. The estimate is normal with the true se; the
  estimated se is se * sqrt(chi2_df / df) (Satterthwaite's df), independent of it: power is the
  average over that distribution (quadrature at 200 quantiles), so it holds for the small df of
  2 + 2 servers too. Checked by simulation in the conformance suite (docs/statistics/conformance.md).
* mde_pct: the smallest change called with 80 % power. It is always above min_effect (a true
  change equal to min_effect is called at most half the time).
* predict(): the variance and df of each comparison for a design not yet run (k servers per arm,
  R rounds per point), from a fitted model's components (e2e.stats.variance_model): the same algebra as
  the verdict's own. servers_needed: the fewest servers per arm whose predicted MDE is at most a
  target; it never contradicts the MDE beside it (both come from one function).
* allocate(): for the adaptive mode, the extra passes and rounds per point that bring every
  comparison's predicted 95 % half-width within the target at the least GPU time, from the
  measured cost of a server start and of a round at each point.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
from scipy import optimize, special
from scipy import stats as st

from e2e.design.point import Point
from e2e.stats import excess as ex
from e2e.stats import variance_model as vm
from e2e.stats.cells import median_variance_factor

POWER = 0.80
MAX_PLAN_SERVERS = 64  # servers_needed above this: None ("more than 64")
ROUND_GRID = (5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64)  # from 5: every cell keeps its own interval
LEVEL = 0.95


def _tq(p: float, df: float) -> float:
    return float(special.ndtri(p)) if df >= vm.MAX_DF else float(special.stdtrit(df, p))


@lru_cache(maxsize=1024)
def _w_nodes(df: float) -> np.ndarray:
    """sqrt(chi2_df / df) at 200 mid-quantiles (1.0 alone for an infinite df)."""
    if df >= vm.MAX_DF:
        return np.ones(1)
    u = (np.arange(200) + 0.5) / 200
    w: np.ndarray = np.sqrt(st.chi2.ppf(u, df) / df)
    return w


def power(delta: float, se: float, df: float, alpha: float, min_effect_pct: float) -> float:
    """P(the verdict calls the change, in its direction) for a true log change delta."""
    if se <= 0:
        return float(abs(math.expm1(delta)) * 100 >= min_effect_pct)
    c = _tq(1 - alpha / 2, df)
    w = _w_nodes(round(df, 3))
    d = abs(delta)
    m = math.log1p(min_effect_pct / 100) if delta >= 0 else -math.log1p(-min_effect_pct / 100)
    thr = np.maximum(c * se * w, m)
    return float(np.mean(special.ndtr((d - thr) / se)))


def mde_pct(se: float, df: float, alpha: float, min_effect_pct: float, pw: float = POWER) -> float | None:
    """Smallest % slowdown called "slower" with probability pw; None for se <= 0."""
    if not se or se <= 0 or not math.isfinite(se):
        return None
    hi = math.log1p(min_effect_pct / 100) + 10 * se * _tq(1 - alpha / 2, df) + 1e-6
    while power(hi, se, df, alpha, min_effect_pct) < pw:
        hi *= 2
        if hi > 50:
            return None
    d = optimize.brentq(lambda x: power(x, se, df, alpha, min_effect_pct) - pw, 0.0, hi, xtol=1e-9)
    return 100 * math.expm1(d)


def half_width_pct(se: float, df: float, level: float = LEVEL) -> float:
    """Half-width of the ratio's interval exp(+-t se), as % of the ratio (the larger side)."""
    return 100 * math.expm1(_tq(0.5 + level / 2, df) * se)


# -- designs not yet run ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Components:
    """What planning needs of a fitted model: the variance components and the pooled noise per
    (arm, point) and length (relative per-value variance q, its degrees of freedom nu)."""

    sigma2_server: float
    tau2: float  # the cell excess (at the noisiest point when it grows with the noise)
    q: dict[tuple[str, Point], tuple[float, float]]
    nu: dict[tuple[str, Point], tuple[float, float]] = field(default_factory=dict)
    source: str = "fit"
    weights: dict[Point, float] | None = None  # the excess's weight per point (None: one for every point)

    @classmethod
    def of(cls, f: vm.Fit, source: str = "fit") -> Components:
        q = {g: (float(f.noise.q[j, 0]), float(f.noise.q[j, 1])) for j, g in enumerate(f.design.groups)}
        nu = {g: (float(f.noise.nu[j, 0]), float(f.noise.nu[j, 1])) for j, g in enumerate(f.design.groups)}
        return cls(f.sigma2_server, f.tau2, q, nu, source, f.excess_weights)

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str) -> Components:
        """From a variance_model Fit.to_dict() (a report's summary.json)."""
        q = {(g["arm"], Point.of(g)): (g["rel_sd_long"] ** 2, g["rel_sd_short"] ** 2) for g in d["groups"]}
        nu = {(g["arm"], Point.of(g)): (g["df_long"], g["df_short"]) for g in d["groups"]}
        tau2 = d["sd_cell_excess"] ** 2
        if (d.get("cell_excess") or {}).get("model") not in (ex.PROPORTIONAL, ex.PER_POINT, ex.BATCH):
            return cls(
                d["sd_server"] ** 2, tau2, q, nu, source, None
            )  # one excess: groups carry no excess of their own
        w = {Point.of(g): g["sd_cell_excess"] ** 2 / tau2 if tau2 > 0 else 1.0 for g in d["groups"]}
        return cls(d["sd_server"] ** 2, tau2, q, nu, source, w)

    def for_groups(self, groups: Iterable[tuple[str, Point]]) -> Components:
        """The same components for other arm names at the same points (a prior from another run):
        each group takes its own noise, else the noisiest arm's at its point."""
        q = dict(self.q)
        for arm, point in groups:
            if (arm, point) not in q:
                same = [v for (a, pt), v in self.q.items() if pt == point]
                if not same:
                    raise ValueError(f"no noise level for point {point} in {self.source}")
                q[(arm, point)] = max(same, key=sum)
        return Components(self.sigma2_server, self.tau2, q, self.nu, self.source, self.weights)


def hypothetical_cells(
    arms: Sequence[str],
    points: Sequence[Point],
    servers_per_arm: int,
    rounds: dict[Point, int],
    shared_servers: bool,
    tag: str = "new",
) -> list[vm.Cell]:
    """k servers per arm; per-arm-pass (shared_servers): each serves every point; fresh: one per cell."""
    out = []
    for a in arms:
        for s in range(servers_per_arm):
            for d in points:
                server = f"{tag}:{a}:{s}" + ("" if shared_servers else f":{d}")
                out.append(vm.Cell(a, d, server, rounds[d], rounds[d]))
    return out


def predict(
    comp: Components, cells: Sequence[vm.Cell], ref: str, comparisons: Sequence[tuple[str, Point]]
) -> dict[tuple[str, Point], tuple[float, float]]:
    """(se, df) of each (arm, point) vs ref in a design of these cells, at the components given.
    The pooled noise's df are those the design's own cells would give."""
    d, theta = vm.planned(cells, comp.sigma2_server, comp.tau2, comp.weights)
    G = len(d.groups)
    q, nu = np.zeros((G, 2)), np.zeros((G, 2))
    for j, g in enumerate(d.groups):
        q[j] = comp.q[g]
    for cell in d.cells:
        j = d.groups.index((cell.arm, cell.point))
        nu[j, 0] += median_variance_factor(cell.n_long)[1]
        nu[j, 1] += median_variance_factor(cell.n_short)[1]
    inf = vm.Inference(d, vm.Noise(q, nu), theta)
    out = {}
    for arm, point in comparisons:
        a, r = d.group(arm, point), d.group(ref, point)
        if a is None or r is None:
            continue
        c = np.zeros(G)
        c[a], c[r] = 1.0, -1.0
        var, df = inf.contrast(c)
        out[(arm, point)] = (math.sqrt(var), df)
    return out


def mde_for_design(
    comp: Components,
    arms: Sequence[str],
    points: Sequence[Point],
    k: int,
    rounds: dict[Point, int],
    shared: bool,
    alpha_step: float,
    min_effect_pct: float,
) -> dict[tuple[str, Point], float | None]:
    cells = hypothetical_cells(arms, points, k, rounds, shared)
    pred = predict(comp, cells, arms[0], [(a, d) for a in arms[1:] for d in points])
    return {key: mde_pct(se, df, alpha_step, min_effect_pct) for key, (se, df) in pred.items()}


def servers_needed(
    comp: Components,
    arms: Sequence[str],
    points: Sequence[Point],
    rounds: dict[Point, int],
    shared: bool,
    alpha_step: float,
    min_effect_pct: float,
    target_mde_pct: float,
) -> dict[tuple[str, Point], int | None]:
    """Per comparison: the fewest servers per arm (balanced, every arm) whose predicted MDE is at
    most target_mde_pct; None beyond MAX_PLAN_SERVERS. One design per k serves every comparison."""
    keys = [(a, d) for a in arms[1:] for d in points]
    need: dict[tuple[str, Point], int | None] = {k: None for k in keys}
    todo = set(keys)
    k = 2
    while todo and k <= MAX_PLAN_SERVERS:
        mdes = mde_for_design(comp, arms, points, k, rounds, shared, alpha_step, min_effect_pct)
        for key in list(todo):
            m = mdes.get(key)
            if m is not None and m <= target_mde_pct:
                need[key] = k
                todo.discard(key)
        k = k + 1 if k < 8 else int(math.ceil(k * 1.25))
    # the coarse steps above 8 may overshoot: walk back down while the smaller k still does it
    for key, n in need.items():
        while n is not None and n > 8:
            m = mde_for_design(comp, arms, points, n - 1, rounds, shared, alpha_step, min_effect_pct).get(key)
            if m is None or m > target_mde_pct:
                break
            n -= 1
        need[key] = n
    return need


# -- the adaptive allocation -------------------------------------------------------------------------
@dataclass
class Costs:
    """Seconds of GPU time: a (warm) server start per arm, and per arm and point the warm-up and
    one round (one long and one short request)."""

    start_s: dict[str, float]
    warmup_s: dict[tuple[str, Point], float]
    round_s: dict[tuple[str, Point], float]

    def of_pass(self, arms: Sequence[str], points: Sequence[Point], rounds: dict[Point, int], shared: bool) -> float:
        """One more pass: a server per arm (per cell in fresh mode), every point at its rounds."""
        total = 0.0
        for a in arms:
            starts = 1 if shared else len(points)
            total += starts * self.start_s[a]
            total += sum(self.warmup_s[(a, d)] + rounds[d] * self.round_s[(a, d)] for d in points)
        return total


@dataclass
class Allocation:
    extra_passes: int
    rounds: dict[Point, int]
    predicted_half_width_pct: dict[str, float]  # "arm@point" -> %
    predicted_s: float
    met: bool
    considered: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "extra_passes": self.extra_passes,
            "rounds": {str(d): r for d, r in self.rounds.items()},
            "predicted_half_width_pct": self.predicted_half_width_pct,
            "predicted_gpu_minutes": self.predicted_s / 60,
            "target_met_by_prediction": self.met,
            "designs_considered": self.considered,
        }


def allocate(
    comp: Components,
    existing: Sequence[vm.Cell],
    arms: Sequence[str],
    points: Sequence[Point],
    shared: bool,
    costs: Costs,
    target_ci_pct: float,
    max_extra_passes: int,
    level: float = LEVEL,
    max_cost_s: float | None = None,
) -> Allocation:
    """The extra passes P (each a server per arm) and rounds R_d per point for their cells that
    bring every comparison's predicted half-width within target_ci_pct at the least cost. For each
    P, each point takes the fewest rounds of ROUND_GRID that meet its own target (a bisection;
    a point's half-width falls with its rounds); the cheapest P wins, and a P whose server starts
    alone cost more than the best found is not tried. Nothing meets it within max_extra_passes:
    the design at max_extra_passes with the most rounds, met False."""
    keys = [(a, d) for a in arms[1:] for d in points]
    considered = 0

    def hw(P: int, rounds: dict[Point, int]) -> dict[tuple[str, Point], float]:
        nonlocal considered
        considered += 1
        cells = list(existing) + hypothetical_cells(arms, points, P, rounds, shared, tag=f"plan{P}")
        return {k: half_width_pct(se, df, level) for k, (se, df) in predict(comp, cells, arms[0], keys).items()}

    def meets(h: dict[tuple[str, Point], float], d: Point | None = None) -> bool:
        return all(v <= target_ci_pct for k, v in h.items() if d is None or k[1] == d)

    best: Allocation | None = None
    for P in range(1, max_extra_passes + 1):
        starts = P * sum(costs.start_s[a] * (1 if shared else len(points)) for a in arms)
        if best is not None and best.met and starts >= best.predicted_s:
            break

        def meets_at(r: dict[Point, int], d: Point, P: int = P) -> bool:
            return meets(hw(P, r), d)

        rounds = _fewest_rounds(meets_at, points)
        cost = P * costs.of_pass(arms, points, rounds, shared)
        if max_cost_s is not None and cost > max_cost_s:
            rounds = {d: ROUND_GRID[0] for d in points}  # affordable, if anything is
            cost = P * costs.of_pass(arms, points, rounds, shared)
            if cost > max_cost_s:
                break
        h = hw(P, rounds)
        cand = Allocation(P, dict(rounds), {f"{a}@{d}": v for (a, d), v in h.items()}, cost, meets(h), 0)
        if best is None or (cand.met and (not best.met or cost < best.predicted_s)) or (not cand.met and not best.met):
            best = cand
    if best is None:  # not even one pass fits the budget
        best = Allocation(0, {d: ROUND_GRID[0] for d in points}, {}, 0.0, False, 0)
    best.considered = considered
    return best


def _fewest_rounds(meets: Callable[[dict[Point, int], Point], bool], points: Sequence[Point]) -> dict[Point, int]:
    """Per point, the fewest rounds of ROUND_GRID whose design meets that point's target (a
    bisection: a point's half-width falls with its rounds), the most where none does."""
    rounds = {d: ROUND_GRID[0] for d in points}
    for d in points:
        lo, hi = 0, len(ROUND_GRID) - 1
        rounds[d] = ROUND_GRID[hi]
        if not meets(rounds, d):
            continue  # even the most rounds miss at this P: keep them
        while lo < hi:
            mid = (lo + hi) // 2
            rounds[d] = ROUND_GRID[mid]
            if meets(rounds, d):
                hi = mid
            else:
                lo = mid + 1
        rounds[d] = ROUND_GRID[lo]
    return rounds
