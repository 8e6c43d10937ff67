"""Change points in a series of runs (ordered by vLLM version) for one arm at one depth. Pure, no I/O.

Input: per run, the per-server results of that arm at that depth (CellStats, or log estimates as
floats). A run is a set of servers; the series is piecewise constant between steps, each step a
change of vLLM (or of anything else between runs).

Design (asv finds steps with an L1 Potts fit; here the confirming test is the run's own between-arm
test, so a step means what "slower"/"faster" means elsewhere in the tool):

* Binary segmentation. In a segment of runs, every split with at least 2 servers on each side is a
  candidate; the split with the smallest p of the pooled comparison (e2e.verdicts.compare_logs:
  servers of the runs before vs after, pooled t on log estimates, variance floored by the cells'
  own noise) is kept iff its Bonferroni-adjusted p is < alpha AND the step is at least
  min_effect_pct (decide). Then both halves are searched again. The Bonferroni factor is the
  number of split positions of the WHOLE series (the best of many looks is not one look, and the
  searches inside the halves are more looks): a flat series yields a step with probability
  <= alpha, and a true step rarely drags false ones in with it.
* Pruning: each kept step is re-tested between its neighbouring final segments (same factor);
  the weakest step that no longer passes is dropped, until all pass.
* A step between runs of few servers is located to within a run or so: a run whose servers
  happen to be slow can take the step (the conformance suite gives the rates).
* Servers pooled within a segment are taken as exchangeable: runs of the same vLLM differ only by
  their servers. A between-run shift with no code change inflates the false step rate; the
  conformance suite measures the rate on flat series (README).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from e2e.errors import UserError
from e2e.stats import LEVEL, CellStats
from e2e.verdicts import FASTER, SLOWER, Comparison, compare_logs, decide

Run = Sequence["CellStats | float"]


@dataclass
class ChangePoint:
    index: int                      # position of the first run after the step
    runs_before: list[Any]          # the runs (labels) of the segment before the step
    runs_after: list[Any]
    ratio: float                    # geometric mean after / before (> 1: later runs slower)
    ci: tuple[float, float] | None  # 95 %, not adjusted
    p: float
    p_adjusted: float               # Bonferroni over the split positions of the series
    decision: str                   # "slower" or "faster" (the same rule as between arms)
    comparison: Comparison

    def to_dict(self) -> dict[str, Any]:
        lo, hi = self.ci or (None, None)
        return {"index": self.index, "runs_before": list(self.runs_before), "runs_after": list(self.runs_after),
                "ratio": self.ratio, "ratio_ci_lo": lo, "ratio_ci_hi": hi, "p_value": self.p,
                "p_adjusted": self.p_adjusted, "decision": self.decision,
                "n_before": self.comparison.n_ref, "n_after": self.comparison.n_arm}


def _as_logs(run: Run) -> tuple[np.ndarray, np.ndarray]:
    x, w = [], []
    for c in run:
        if isinstance(c, CellStats):
            if c.estimate is None or c.estimate <= 0:
                continue
            x.append(math.log(c.estimate))
            w.append(np.nan if c.log_se is None else c.log_se ** 2)
        elif isinstance(c, (int, float)) and math.isfinite(c):
            x.append(float(c))
            w.append(np.nan)
        else:
            raise UserError(f"change points: a run holds {c!r}, not a CellStats or a log estimate")
    return np.array(x), np.array(w)


class _Series:
    def __init__(self, runs: Sequence[Run], alpha: float, min_effect_pct: float, level: float):
        self.logs = [_as_logs(r) for r in runs]
        self.sizes = np.array([len(x) for x, _ in self.logs])
        self.alpha, self.min_effect, self.level = alpha, min_effect_pct, level
        self.factor = max(1, len(self.candidates(0, len(runs))))

    def candidates(self, lo: int, hi: int) -> list[int]:
        return [s for s in range(lo + 1, hi)
                if self.sizes[lo:s].sum() >= 2 and self.sizes[s:hi].sum() >= 2]

    def test(self, lo: int, s: int, hi: int) -> Comparison:
        xr = np.concatenate([self.logs[i][0] for i in range(lo, s)])
        wr = np.concatenate([self.logs[i][1] for i in range(lo, s)])
        xa = np.concatenate([self.logs[i][0] for i in range(s, hi)])
        wa = np.concatenate([self.logs[i][1] for i in range(s, hi)])
        return compare_logs(xr, wr, xa, wa, self.alpha, self.min_effect, self.level)

    def judged(self, cmp: Comparison) -> tuple[float, str]:
        if cmp.p is None:
            return 1.0, "inconclusive"
        p_adj = min(1.0, self.factor * cmp.p)
        return p_adj, decide(cmp.ratio, p_adj, None, self.alpha, self.min_effect)

    def segment(self, lo: int, hi: int) -> list[int]:
        tested = [(self.test(lo, s, hi), s) for s in self.candidates(lo, hi)]
        tested = [(c, s) for c, s in tested if c.p is not None]
        if not tested:
            return []
        best, s = min(tested, key=lambda t: t[0].p)
        if self.judged(best)[1] not in (SLOWER, FASTER):
            return []
        return self.segment(lo, s) + [s] + self.segment(s, hi)


def find_change_points(runs: Sequence[Run], alpha: float = 0.05, min_effect_pct: float = 2.0,
                       labels: Sequence[Any] | None = None, level: float = LEVEL) -> list[ChangePoint]:
    """The steps of a series of runs (see the module docstring), in series order."""
    if labels is not None and len(labels) != len(runs):
        raise UserError(f"change points: {len(labels)} labels for {len(runs)} runs")
    names = list(labels) if labels is not None else list(range(len(runs)))
    ser = _Series(runs, alpha, min_effect_pct, level)
    n = len(runs)
    cps = ser.segment(0, n)
    while True:                                  # prune steps the final neighbours do not confirm
        bounds = [0, *cps, n]
        judged = []
        for i, s in enumerate(cps):
            lo, hi = bounds[i], bounds[i + 2]
            cmp = ser.test(lo, s, hi)
            judged.append((s, lo, hi, cmp, *ser.judged(cmp)))
        weak = [j for j in judged if j[5] not in (SLOWER, FASTER)]
        if not weak:
            break
        cps.remove(max(weak, key=lambda j: j[4])[0])
    return [ChangePoint(s, names[lo:s], names[s:hi], cmp.ratio, cmp.ci, cmp.p, p_adj, dec, cmp)
            for s, lo, hi, cmp, p_adj, dec in judged]
