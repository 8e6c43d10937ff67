"""Simulated grid runs (depth x concurrency), as results/h200-load-tp1 ran them: two arms, 1K and 8K
at c = 1, 4, 16 and 32, 5 rounds per cell, per-arm-pass servers. Cells are drawn as
e2e/validation/simulation.py draws them (cell_rows -> stats.cell_stats, scaled by the server's
offset) and decided by the function a run decides with (e2e/analysis/comparisons.py), the whole
grid one Holm family.

The regimes are calibrated on the committed load rows (calibration() recomputes the figures):
* per-cell noise per point: the FA3 (stock) cells' robust sd of log(estimate) in h200-load-tp1 and
  h200-load-8k-tp1, about 0.1 % at batch 1, 1-1.6 % at c = 4 and 16, and 0.4 % at 1K x 32 (the
  quiet point above batch 1 where the old model failed);
* a server offset of sd 0.24 % (the fit of h200-load-tp1) shared by every point a server serves;
* a server x point term (the cell excess): 0.1 % at batch 1, and at c > 1 the `batch` sd: 1.8 %
  in `h200-grid` (the FA3 pass pairs at c >= 16: root mean square of their log differences over
  sqrt 2, 1.9 %), twice that in `h200-grid-2x`, none in `h200-grid-0`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from e2e.analysis import comparisons
from e2e.design.point import Point
from e2e.stats import cells as stats
from e2e.stats import variance_model as vm
from e2e.stats import verdicts as v
from e2e.validation.simulation import ALPHA, LONG, SEED, SHORT, cell_rows, scaled

ROUNDS = 5
POINTS = tuple(Point(d, c) for c in (1, 4, 16, 32) for d in (1024, 8192))
TPT_MS = {1024: 10.9, 8192: 11.0}
# per-value sd / T64 by point, chosen so a cell of 5 rounds has the committed FA3 cells' log sd
NOISE = {
    Point(1024, 1): 0.001,
    Point(8192, 1): 0.001,
    Point(1024, 4): 0.012,
    Point(8192, 4): 0.014,
    Point(1024, 16): 0.017,
    Point(8192, 16): 0.019,
    Point(1024, 32): 0.0043,
    Point(8192, 32): 0.022,
}
POOL = 150

SimCell = tuple[str, Point, str, stats.CellStats]


@dataclass(frozen=True)
class GridRegime:
    name: str
    batch: float  # log-sd of the server x point term at c > 1
    server_sd: float = 0.0024
    batch1: float = 0.001  # the term at batch 1
    min_effect: float = 2.0
    batch4: float | None = None  # the term at c = 4, where it differs from `batch`

    def excess(self, p: Point) -> float:
        if p.concurrency == 4 and self.batch4 is not None:
            return self.batch4
        return self.batch if p.concurrency > 1 else self.batch1


GRID_REGIMES = {
    "h200-grid-0": GridRegime("h200-grid-0", 0.001),
    "h200-grid": GridRegime("h200-grid", 0.018),
    "h200-grid-2x": GridRegime("h200-grid-2x", 0.036),
    "h200-grid-mixed": GridRegime("h200-grid-mixed", 0.025, batch4=0.005),
}


class GridSim:
    """Pools of simulated cells per (point, effect), and grid runs drawn from them."""

    def __init__(self, seed: int = SEED, pool: int = POOL):
        self.seed, self.pool_size = seed, pool
        self.rng = np.random.default_rng([seed, 7])
        self.pools: dict[tuple[Point, float], list[stats.CellStats]] = {}

    def pool(self, p: Point, effect: float) -> list[stats.CellStats]:
        key = (p, round(effect, 10))
        if key not in self.pools:
            rng = np.random.default_rng([self.seed, p.depth, p.concurrency, int(effect * 1e9) % 2**32])
            tpt = TPT_MS[p.depth] * (1 + effect)
            self.pools[key] = [
                stats.cell_stats(cell_rows(rng, tpt, NOISE[p], ROUNDS), LONG, SHORT) for _ in range(self.pool_size)
            ]
        return self.pools[key]

    def run(self, rg: GridRegime, k: int, effects: dict[str, dict[Point, float]]) -> list[SimCell]:
        """k servers per arm, each serving every point (per-arm-pass)."""
        out = []
        for arm, eff in effects.items():
            for s in range(k):
                u = self.rng.normal(0.0, rg.server_sd)
                for p in POINTS:
                    pool = self.pool(p, eff.get(p, 0.0))
                    c = pool[int(self.rng.integers(len(pool)))]
                    out.append((arm, p, f"{arm}{s}", scaled(c, math.exp(u + self.rng.normal(0.0, rg.excess(p))))))
        return out


def family(cells: list[SimCell], ref: str, min_effect: float) -> dict[Point, v.Comparison]:
    """The run's comparisons at every point, one fit and one Holm family (comparisons.decide)."""
    f = vm.fit(list(cells))
    arms = [ref] + [a for a in dict.fromkeys(c[0] for c in cells) if a != ref]

    def cells_of(arm: str, p: Point) -> list[stats.CellStats]:
        return [c[3] for c in cells if c[0] == arm and c[1] == p]

    decided, _ = comparisons.decide(f, arms, POINTS, cells_of, ALPHA, min_effect)
    return {p: c for (_, p), c in decided.items()}


def calibration(root: Path) -> dict[str, float]:
    """The regimes' figures from the committed load rows: the FA3 (stock) cells' median robust sd of
    log(estimate) per point, and the server x point term at c >= 16 from its pass pairs (root mean
    square of the pairs' log differences over sqrt 2)."""
    from e2e.analysis.run_analysis import RunAnalysis  # a run folder's reader: only here

    sds: dict[str, list[float]] = {}
    diffs = []
    for run in ("h200-load-tp1", "h200-load-8k-tp1"):
        a = RunAnalysis(root / "results" / run)
        for p in POINTS:
            cs = [a.cells[("stock", p, q)] for q in a.passes if ("stock", p, q) in a.cells]
            cs = [c for c in cs if c.estimate and c.robust_log_var is not None]
            sds.setdefault(f"noise {p}", []).extend(math.sqrt(c.robust_log_var or 0.0) for c in cs)
            if len(cs) == 2 and p.concurrency >= 16:
                diffs.append(math.log(cs[0].estimate / cs[1].estimate))  # type: ignore[operator]
    out = {k: float(np.median(x)) for k, x in sds.items() if x}
    out["batch term c >= 16"] = math.sqrt(float(np.mean(np.square(diffs))) / 2)
    return out
