"""Change points in a series of runs for one arm at one depth, and whether the rest held still. Pure,
no I/O.

Input: per run, the per-server results of that arm at that depth (CellStats, or log estimates as
floats). A run is a set of servers; the series is piecewise constant between steps, each step a
change of vLLM (or of anything else between runs).

Design (asv finds steps with an L1 Potts fit; here the confirming test is the run's own variance
model, so a step means what "slower"/"faster" means elsewhere in the tool):

* The model of a stretch of runs (e2e/stats/variance_model.py): the runs before and after a split are
  the two groups, and the RUN is a random factor beside the cells' own noise: two runs of the same
  vLLM differ by more than their servers (run-to-run variation: another day, another machine
  state). Servers of one run are not exchangeable with servers of another, so a 1 % shift between
  runs does not read as a step of vLLM. With one run on each side the run-to-run variance cannot
  be estimated; the test then adds a stated run-to-run sd (`run_sd`: the prior of
  e2e/analysis/run_prior.py, one offset a side, e2e/stats/run_to_run.py) and says so
  (`run_variance`); with run_sd 0 it treats servers as exchangeable.
* What it could find: each series states the smallest step its tested splits would call with 80 %
  power (`detectable_pct`: planning.mde_pct at the split's se, df and Bonferroni step, the least
  over the splits; the best-placed split is near the middle). The conformance of this figure is
  e2e/validation/conformance_runs.py.
* Binary segmentation with a cheap scan. In a segment of runs, every split with at least 2 servers
  on each side is a candidate. A scan ranks them in one pass over prefix sums (the weighted
  between-sides sum of squares of the run means, and how far each split's step may reach past the
  min effect); only the best few (TESTED of each ranking) get the model's test, which reads the
  runs nearest the split (SIDE_CELLS cells a side at most: the fit is cubic in its cells). The
  tested split with the smallest p is kept iff its Bonferroni-adjusted p is < alpha AND the step
  is at least min_effect_pct (decide). The Bonferroni factor is the number of split positions of
  the WHOLE series times the number of series in the family (every arm x depth of a history): a
  flat history yields any step with probability <= alpha, however few splits were tested.
* Pruning: each kept step is re-tested between its neighbouring final segments (same factor);
  the weakest step that no longer passes is dropped, until all pass.
* A stretch without a step is said to hold still only when every split the scan doubts most is
  shown equivalent (TOST against +-min effect, each at alpha: an intersection-union test needs no
  correction); otherwise the series cannot tell, and the split nearest to failing says by how much.
* A step between runs of few servers is located to within a run or so (the conformance suite
  gives the rates). `python -m e2e.validation.bench_changepoints` times the search on long series.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from e2e.design.defaults import ALPHA, MIN_EFFECT_PCT
from e2e.design.point import Point
from e2e.errors import UserError
from e2e.stats import planning
from e2e.stats import variance_model as vm
from e2e.stats.cells import LEVEL, CellStats, Noise
from e2e.stats.run_to_run import widen
from e2e.stats.verdicts import (
    EQUIVALENT,
    FASTER,
    INCONCLUSIVE,
    INSUFFICIENT_REPLICATION,
    SLOWER,
    Comparison,
    decide,
    inconclusive_note,
    model_comparison,
)

Run = Sequence["CellStats | float"]
BEFORE, AFTER = "before", "after"
ONE = Point(1)  # a series is one arm at one point: the fit needs a point, any one
TESTED = 3  # splits of a segment the model tests from each of the scan's two rankings
SIDE_CELLS = 48  # a test reads the runs nearest its split until a side holds this many cells


@dataclass
class ChangePoint:
    """A split of the series tested by the model: a step (decision slower or faster), or, for a
    stretch without one, the split least shown to hold still (equivalent or inconclusive)."""

    index: int  # position of the first run after the split
    runs_before: list[Any]  # the runs (labels) the test read before the split
    runs_after: list[Any]
    ratio: float  # geometric mean after / before (> 1: later runs slower)
    ci: tuple[float, float] | None  # 95 %, not adjusted
    p: float
    p_adjusted: float  # Bonferroni over the split positions and the series
    decision: str  # "slower" or "faster" (the same rule as between arms); equivalent / inconclusive
    comparison: Comparison
    run_variance: str  # "estimated", or why not

    def to_dict(self) -> dict[str, Any]:
        lo, hi = self.ci or (None, None)
        return {
            "index": self.index,
            "runs_before": list(self.runs_before),
            "runs_after": list(self.runs_after),
            "ratio": self.ratio,
            "ratio_ci_lo": lo,
            "ratio_ci_hi": hi,
            "p_value": self.p,
            "p_adjusted": self.p_adjusted,
            "p_equiv": self.comparison.p_equiv,
            "decision": self.decision,
            "df": self.comparison.df,
            "mde_pct": self.comparison.mde_pct,
            "n_before": self.comparison.n_ref,
            "n_after": self.comparison.n_arm,
            "run_variance": self.run_variance,
            "warnings": list(self.comparison.warnings),
        }


@dataclass
class Stretch:
    """Runs between two steps (or the series' ends), and whether they held still: equivalent (every
    split the scan doubts most shown within +-min effect), inconclusive, or insufficient replication
    (no split with 2 servers a side). `worst`: the split nearest to failing (None: nothing tested)."""

    runs: list[Any]
    decision: str
    worst: ChangePoint | None
    mde_pct: float | None = None  # the smallest step a tested split would call with 80 % power

    def to_dict(self) -> dict[str, Any]:
        return {
            "runs": list(self.runs),
            "decision": self.decision,
            "worst": self.worst and self.worst.to_dict(),
            "mde_pct": self.mde_pct,
        }


@dataclass
class SeriesResult:
    steps: list[ChangePoint]
    stretches: list[Stretch]  # one per segment between the steps, in series order
    run_sd_assumed: bool = False  # a test had one run a side and took the stated run_sd

    @property
    def decision(self) -> str:
        """slower / faster (a step: the first slower one wins), else how the stretches held: equivalent
        when every one did, else inconclusive or insufficient replication."""
        for word in (SLOWER, FASTER):
            if any(c.decision == word for c in self.steps):
                return word
        held = {s.decision for s in self.stretches if len(s.runs) > 1}
        if not held or held == {EQUIVALENT}:
            return EQUIVALENT if held else INSUFFICIENT_REPLICATION
        return INCONCLUSIVE if INCONCLUSIVE in held else INSUFFICIENT_REPLICATION

    @property
    def detectable_pct(self) -> float | None:
        """The smallest step any tested split of the series would call with 80 % power (None: none tested)."""
        found = [m for m in [s.mde_pct for s in self.stretches] + [c.comparison.mde_pct for c in self.steps] if m]
        return min(found, default=None)


def _as_cell(c: CellStats | float) -> CellStats | None:
    """A CellStats as it is; a float (a log estimate, in tests and simulations) as a cell with that
    estimate and no noise of its own (its variance is all between servers)."""
    if isinstance(c, CellStats):
        return c if c.estimate is not None and c.estimate > 0 and c.noise is not None else None
    if isinstance(c, (int, float)) and math.isfinite(c):
        return CellStats(
            math.exp(c), None, 0, 2, 2, 0, None, [], [], None, None, noise=Noise(2, 2, 0.0, 0.0), n_long=2, n_short=1
        )
    raise UserError(f"change points: a run holds {c!r}, not a CellStats or a log estimate")


class _Series:
    def __init__(
        self, runs: Sequence[Run], alpha: float, min_effect_pct: float, level: float, n_series: int, run_sd: float = 0.0
    ):
        self.run_sd, self.assumed = run_sd, False
        self.runs = [[x for x in map(_as_cell, r) if x is not None] for r in runs]
        self.sizes = np.array([len(r) for r in self.runs], dtype=int)
        self.alpha, self.min_effect, self.level = alpha, min_effect_pct, level
        self.factor = max(1, len(self.candidates(0, len(runs)))) * max(1, n_series)
        logs = [np.log([c.estimate for c in r if c.estimate]) for r in self.runs]
        self.means = np.array([x.mean() if x.size else 0.0 for x in logs])
        within = [(float(x.var(ddof=1)), x.size - 1) for x in logs if x.size > 1]
        dof = sum(d for _, d in within)
        self.within = sum(v * d for v, d in within) / dof if dof else 0.0  # pooled server variance in a run
        self.tests: dict[tuple[int, int, int], tuple[Comparison, str]] = {}

    def candidates(self, lo: int, hi: int) -> list[int]:
        ahead = np.cumsum(self.sizes[lo:hi])
        total = int(ahead[-1]) if hi > lo else 0
        return [lo + j for j in range(1, hi - lo) if ahead[j - 1] >= 2 and total - ahead[j - 1] >= 2]

    def scan(self, lo: int, hi: int, splits: list[int]) -> list[int]:
        """The splits the model tests: the TESTED best by the weighted between-sides sum of squares of
        the run means (where a step most likely is), and the TESTED whose step may reach furthest past
        the min effect (where holding still is least shown). Run means are weighted by
        1 / (run-to-run variance + server variance / servers), both by moments over the segment."""
        if len(splits) <= 2 * TESTED:
            return splits
        k, m = self.sizes[lo:hi].astype(float), self.means[lo:hi]
        has = k > 0
        spread = float(np.var(m[has], ddof=1)) if has.sum() > 1 else 0.0
        between = max(0.0, spread - float(np.mean(self.within / k[has])))
        with np.errstate(divide="ignore"):
            w = np.where(has, 1.0 / (between + self.within / np.where(has, k, 1.0)), 0.0)
        if not np.all(np.isfinite(w)):  # no variance at all: weigh by servers
            w = k
        cw, cwm = np.cumsum(w), np.cumsum(w * m)
        j = np.array(splits) - lo - 1  # the last run before each split
        wb, wa = cw[j], cw[-1] - cw[j]
        gap = np.abs(cwm[j] / wb - (cwm[-1] - cwm[j]) / wa)
        sum_sq = wb * wa / (wb + wa) * gap**2
        reach = (gap - math.log1p(self.min_effect / 100)) / np.sqrt(1 / wb + 1 / wa)
        picked = {splits[int(i)] for i in np.argsort(-sum_sq, kind="stable")[:TESTED]}
        picked |= {splits[int(i)] for i in np.argsort(-reach, kind="stable")[:TESTED]}
        return sorted(picked)

    def window(self, lo: int, s: int, hi: int) -> tuple[int, int]:
        """The runs a test of split s reads: nearest first, until a side holds SIDE_CELLS cells."""
        a, b, before, after = s, s, 0, 0
        while a > lo and before < SIDE_CELLS:
            a -= 1
            before += int(self.sizes[a])
        while b < hi and after < SIDE_CELLS:
            after += int(self.sizes[b])
            b += 1
        return a, b

    def test(self, lo: int, s: int, hi: int) -> tuple[Comparison, str]:
        a, b = self.window(lo, s, hi)
        if (a, s, b) not in self.tests:
            self.tests[(a, s, b)] = self._test(a, s, b)
        return self.tests[(a, s, b)]

    def _test(self, lo: int, s: int, hi: int) -> tuple[Comparison, str]:
        cells: list[tuple[str, Point, str, CellStats]] = []
        runs: list[str] = []
        before: list[CellStats] = []
        after: list[CellStats] = []
        for i in range(lo, hi):
            side = BEFORE if i < s else AFTER
            for j, c in enumerate(self.runs[i]):
                cells.append((side, ONE, f"r{i}s{j}", c))
                runs.append(f"r{i}")
                (before if i < s else after).append(c)
        f = vm.fit(cells, factors=("run",), runs=runs)
        cmp = model_comparison(f, AFTER, BEFORE, ONE, before, after, self.alpha, self.min_effect, self.level)
        if f is None or "run" in f.design.kept:
            how = "estimated" if f is not None else "no fit"
        elif "run" in f.design.unestimable and self.run_sd > 0:
            widen(cmp, 2 * self.run_sd**2, float(np.exp(np.mean([math.log(c.estimate or 1) for c in before]))))
            how = f"assumed: a run-to-run sd of {100 * self.run_sd:.2g} % (one run a side: not measured)"
            self.assumed = True
        elif "run" in f.design.unestimable:
            how = "not estimable (one run a side): servers of different runs taken as exchangeable"
        else:
            how = "one server per run: run-to-run and server variance together"
        return cmp, how

    def judged(self, cmp: Comparison) -> tuple[float, str]:
        """(Bonferroni-adjusted p, decision); the equivalence test stays at alpha (see the docstring)."""
        if cmp.p is None:
            return 1.0, INCONCLUSIVE
        p_adj = min(1.0, self.factor * cmp.p)
        return p_adj, decide(cmp.ratio, p_adj, cmp.p_equiv, self.alpha, self.min_effect)

    def segment(self, lo: int, hi: int) -> list[int]:
        tested = [(self.test(lo, s, hi)[0], s) for s in self.scan(lo, hi, self.candidates(lo, hi))]
        with_p = [(c, c.p, s) for c, s in tested if c.p is not None]
        if not with_p:
            return []
        best, _, s = min(with_p, key=lambda t: t[1])
        if self.judged(best)[1] not in (SLOWER, FASTER):
            return []
        return self.segment(lo, s) + [s] + self.segment(s, hi)

    def point(self, lo: int, s: int, hi: int, names: list[Any]) -> ChangePoint:
        cmp, how = self.test(lo, s, hi)
        p_adj, dec = self.judged(cmp)
        a, b = self.window(lo, s, hi)
        cmp.p_adjusted, cmp.p_equiv_adjusted, cmp.decision = p_adj, cmp.p_equiv, dec
        cmp.alpha_step = self.alpha / self.factor
        if cmp.se_log and cmp.df is not None:
            cmp.mde_pct = planning.mde_pct(cmp.se_log, cmp.df, cmp.alpha_step, self.min_effect)
        inconclusive_note(cmp)
        ratio = cmp.ratio if cmp.ratio is not None else math.nan
        return ChangePoint(s, names[a:s], names[s:b], ratio, cmp.ci, cmp.p or 1.0, p_adj, dec, cmp, how)

    def stretch(self, lo: int, hi: int, names: list[Any]) -> Stretch:
        splits = self.scan(lo, hi, self.candidates(lo, hi))
        if not splits:
            return Stretch(names[lo:hi], INSUFFICIENT_REPLICATION, None)
        points = [self.point(lo, s, hi, names) for s in splits]
        held = all(c.decision == EQUIVALENT for c in points)
        worst = max(points, key=lambda c: 1.0 if c.comparison.p_equiv is None else c.comparison.p_equiv)
        mde = min((m for c in points if (m := c.comparison.mde_pct)), default=None)
        return Stretch(names[lo:hi], EQUIVALENT if held else INCONCLUSIVE, worst, mde)


def _prepare(
    runs: Sequence[Run],
    alpha: float,
    min_effect_pct: float,
    labels: Sequence[Any] | None,
    level: float,
    n_series: int,
    run_sd: float,
) -> tuple[_Series, list[Any]]:
    if labels is not None and len(labels) != len(runs):
        raise UserError(f"change points: {len(labels)} labels for {len(runs)} runs")
    if not (math.isfinite(run_sd) and run_sd >= 0):
        raise UserError(f"change points: run_sd {run_sd!r} is not a finite sd >= 0")
    names = list(labels) if labels is not None else list(range(len(runs)))
    return _Series(runs, alpha, min_effect_pct, level, n_series, run_sd), names


def _steps(ser: _Series, names: list[Any]) -> list[ChangePoint]:
    """Binary segmentation, then pruning: each step re-tested between its final neighbours."""
    n = len(names)
    cps = ser.segment(0, n) if n else []
    while True:
        bounds = [0, *cps, n]
        judged = [ser.point(bounds[i], s, bounds[i + 2], names) for i, s in enumerate(cps)]
        weak = [c for c in judged if c.decision not in (SLOWER, FASTER)]
        if not weak:
            return judged
        cps.remove(max(weak, key=lambda c: c.p_adjusted).index)


def find_change_points(
    runs: Sequence[Run],
    alpha: float = ALPHA,
    min_effect_pct: float = MIN_EFFECT_PCT,
    labels: Sequence[Any] | None = None,
    level: float = LEVEL,
    n_series: int = 1,
    run_sd: float = 0.0,
) -> list[ChangePoint]:
    """The steps of a series of runs (see the module docstring), in series order. n_series: the
    number of series in the family this one is tested with (a history's arm x depth series);
    run_sd: the run-to-run sd (log scale) assumed where a split has one run a side."""
    return _steps(*_prepare(runs, alpha, min_effect_pct, labels, level, n_series, run_sd))


def judge_series(
    runs: Sequence[Run],
    alpha: float = ALPHA,
    min_effect_pct: float = MIN_EFFECT_PCT,
    labels: Sequence[Any] | None = None,
    level: float = LEVEL,
    n_series: int = 1,
    run_sd: float = 0.0,
) -> SeriesResult:
    """The steps (find_change_points) and how each stretch between them held."""
    ser, names = _prepare(runs, alpha, min_effect_pct, labels, level, n_series, run_sd)
    steps = _steps(ser, names)
    bounds = [0, *(c.index for c in steps), len(names)]
    stretches = [ser.stretch(a, b, names) for a, b in zip(bounds, bounds[1:]) if b > a]
    return SeriesResult(steps, stretches, ser.assumed)
