"""Change points in a series of runs for one arm at one depth. Pure, no I/O.

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
  be estimated; the test then treats servers as exchangeable and says so (`run_variance`).
* Binary segmentation. In a segment of runs, every split with at least 2 servers on each side is a
  candidate; the split with the smallest p is kept iff its Bonferroni-adjusted p is < alpha AND the
  step is at least min_effect_pct (decide). The Bonferroni factor is the number of split positions
  of the WHOLE series times the number of series in the family (every arm x depth of a history):
  a flat history yields any step with probability <= alpha.
* Pruning: each kept step is re-tested between its neighbouring final segments (same factor);
  the weakest step that no longer passes is dropped, until all pass.
* A step between runs of few servers is located to within a run or so (the conformance suite
  gives the rates).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from e2e.errors import UserError
from e2e.stats import variance_model as vm
from e2e.stats.cells import LEVEL, CellStats, Noise
from e2e.stats.verdicts import FASTER, SLOWER, Comparison, decide, model_comparison

Run = Sequence["CellStats | float"]
BEFORE, AFTER = "before", "after"


@dataclass
class ChangePoint:
    index: int  # position of the first run after the step
    runs_before: list[Any]  # the runs (labels) of the segment before the step
    runs_after: list[Any]
    ratio: float  # geometric mean after / before (> 1: later runs slower)
    ci: tuple[float, float] | None  # 95 %, not adjusted
    p: float
    p_adjusted: float  # Bonferroni over the split positions and the series
    decision: str  # "slower" or "faster" (the same rule as between arms)
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
            "decision": self.decision,
            "df": self.comparison.df,
            "n_before": self.comparison.n_ref,
            "n_after": self.comparison.n_arm,
            "run_variance": self.run_variance,
        }


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
    def __init__(self, runs: Sequence[Run], alpha: float, min_effect_pct: float, level: float, n_series: int):
        self.runs = [[x for x in map(_as_cell, r) if x is not None] for r in runs]
        self.sizes = [len(r) for r in self.runs]
        self.alpha, self.min_effect, self.level = alpha, min_effect_pct, level
        self.factor = max(1, len(self.candidates(0, len(runs)))) * max(1, n_series)

    def candidates(self, lo: int, hi: int) -> list[int]:
        return [s for s in range(lo + 1, hi) if sum(self.sizes[lo:s]) >= 2 and sum(self.sizes[s:hi]) >= 2]

    def test(self, lo: int, s: int, hi: int) -> tuple[Comparison, str]:
        cells: list[tuple[str, int, str, CellStats]] = []
        runs: list[str] = []
        before: list[CellStats] = []
        after: list[CellStats] = []
        for i in range(lo, hi):
            side = BEFORE if i < s else AFTER
            for j, c in enumerate(self.runs[i]):
                cells.append((side, 1, f"r{i}s{j}", c))
                runs.append(f"r{i}")
                (before if i < s else after).append(c)
        f = vm.fit(cells, factors=("run",), runs=runs)
        cmp = model_comparison(f, AFTER, BEFORE, 1, before, after, self.alpha, self.min_effect, self.level)
        if f is None or "run" in f.design.kept:
            how = "estimated" if f is not None else "no fit"
        elif "run" in f.design.unestimable:
            how = "not estimable (one run a side): servers of different runs taken as exchangeable"
        else:
            how = "one server per run: run-to-run and server variance together"
        return cmp, how

    def judged(self, cmp: Comparison) -> tuple[float, str]:
        if cmp.p is None:
            return 1.0, "inconclusive"
        p_adj = min(1.0, self.factor * cmp.p)
        return p_adj, decide(cmp.ratio, p_adj, None, self.alpha, self.min_effect)

    def segment(self, lo: int, hi: int) -> list[int]:
        tested = [(self.test(lo, s, hi)[0], s) for s in self.candidates(lo, hi)]
        with_p = [(c, c.p, s) for c, s in tested if c.p is not None]
        if not with_p:
            return []
        best, _, s = min(with_p, key=lambda t: t[1])
        if self.judged(best)[1] not in (SLOWER, FASTER):
            return []
        return self.segment(lo, s) + [s] + self.segment(s, hi)


def find_change_points(
    runs: Sequence[Run],
    alpha: float = 0.05,
    min_effect_pct: float = 2.0,
    labels: Sequence[Any] | None = None,
    level: float = LEVEL,
    n_series: int = 1,
) -> list[ChangePoint]:
    """The steps of a series of runs (see the module docstring), in series order. n_series: the
    number of series in the family this one is tested with (a history's arm x depth series)."""
    if labels is not None and len(labels) != len(runs):
        raise UserError(f"change points: {len(labels)} labels for {len(runs)} runs")
    names = list(labels) if labels is not None else list(range(len(runs)))
    ser = _Series(runs, alpha, min_effect_pct, level, n_series)
    n = len(runs)
    cps = ser.segment(0, n)
    while True:  # prune steps the final neighbours do not confirm
        bounds = [0, *cps, n]
        judged = []
        for i, s in enumerate(cps):
            lo, hi = bounds[i], bounds[i + 2]
            cmp, how = ser.test(lo, s, hi)
            judged.append((s, lo, hi, cmp, how, *ser.judged(cmp)))
        weak = [j for j in judged if j[6] not in (SLOWER, FASTER)]
        if not weak:
            break
        cps.remove(max(weak, key=lambda j: j[5])[0])
    out = []
    for s, lo, hi, cmp, how, p_adj, dec in judged:
        # every step left is "slower" or "faster", which decide() gives only with a ratio and a p
        assert cmp.ratio is not None and cmp.p is not None
        out.append(ChangePoint(s, names[lo:s], names[s:hi], cmp.ratio, cmp.ci, cmp.p, p_adj, dec, cmp, how))
    return out
