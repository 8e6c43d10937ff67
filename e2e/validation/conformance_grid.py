"""The grid rows of the conformance table: simulated grid runs (e2e/validation/sim_grid.py: 1K and 8K
x c = 1, 4, 16, 32, a server x concurrency term calibrated on the committed load rows) decided as a
run decides them, the whole grid one Holm family of 8.

    python -m e2e.validation.conformance_grid --experiments 200

runs these rows alone (the whole table, e2e/validation/conformance.py, holds them too). Targets: A/A
"slower"/"faster" anywhere at most 5 % (+3 Monte-Carlo se), and the 95 % interval covering the true
ratio at least 93 % at every point (-3 Monte-Carlo se of n runs). Power: a true change at 1K x 32
equal to the median MDE the A/A runs printed there, called "slower" (stated, no target: the median
printed se is not the true se)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from e2e.stats import verdicts as v
from e2e.validation.conformance_figures import Figure, at_most, covers_one, rate, table_main, tol
from e2e.validation.sim_grid import GRID_REGIMES, POINTS, GridRegime, GridSim, family

GRID = (("h200-grid-0", 2), ("h200-grid", 2), ("h200-grid-2x", 2), ("h200-grid-mixed", 2), ("h200-grid", 3))
QUIET = POINTS[-2]  # 1K x 32: the quiet point above batch 1, where the old model covered 68.5 %


def grid_aa(sim: GridSim, name: str, rg: GridRegime, k: int, n: int) -> list[Figure]:
    """A/A grid runs of k servers per arm: false decisions family-wise, coverage and the median
    printed MDE at every point."""
    d = f"A/A grid, {name} (server x concurrency sd {100 * rg.batch:g} %"
    d += f", {100 * rg.batch4:g} % at c=4)" if rg.batch4 is not None else ")"
    d += f", {k} servers per arm, 1K/8K x c 1/4/16/32 (family of 8)"
    fams = [family(sim.run(rg, k, {"ref": {}, "arm": {}}), "ref", rg.min_effect) for _ in range(n)]
    tag = f"{name}_k{k}"
    decided = [any(c.decision in (v.SLOWER, v.FASTER) for c in f.values()) for f in fams]
    out = [at_most(f"grid_decided_{tag}", '"slower"/"faster" anywhere (false, family-wise)', d, decided, 0.05)]
    slack = tol(0.95, n)
    for p in POINTS:
        r = rate([covers_one(f[p]) for f in fams])
        what = f"95 % interval covers the true ratio at {p.depth // 1024}K x {p.concurrency}"
        out.append(
            Figure(
                f"grid_coverage_{tag}_{p.name}", what, d, r, n, f">= 93 % (-{100 * slack:.1f} MC)", r >= 0.93 - slack
            )
        )
    for p in POINTS:
        mdes = [m for f in fams if (m := f[p].mde_pct) is not None]
        what = f"median printed MDE at {p.depth // 1024}K x {p.concurrency}, %"
        out.append(Figure(f"grid_mde_{tag}_{p.name}", what, d, float(np.median(mdes)) if mdes else float("nan")))
    return out


def grid_power(sim: GridSim, name: str, k: int, n: int, mde: float) -> Figure:
    """A true change of the median printed MDE at 1K x 32 (the other points A/A): "slower" there."""
    rg = GRID_REGIMES[name]
    hits = [
        family(sim.run(rg, k, {"ref": {}, "arm": {QUIET: mde / 100}}), "ref", rg.min_effect)[QUIET].decision == v.SLOWER
        for _ in range(n)
    ]
    d = f"true change at 1K x 32 = the median printed MDE ({mde:.2f} %), {name}, {k} servers per arm"
    return Figure(f"grid_power_{name}_k{k}", '"slower" (power, stated)', d, rate(hits), n)


def grid_figures(sim: GridSim, n: int) -> list[Figure]:
    out: list[Figure] = []
    for name, k in GRID:
        out += grid_aa(sim, name, GRID_REGIMES[name], k, n)
        if name == "h200-grid":
            mde = next(f.value for f in out if f.key == f"grid_mde_{name}_k{k}_{QUIET.name}")
            out.append(grid_power(sim, name, k, n, mde))
    return out


def run(n: int, seed: int) -> list[Figure]:
    return grid_figures(GridSim(seed), n)


def main(argv: list[str] | None = None, echo: Callable[[str], None] = print) -> int:
    return table_main("python -m e2e.validation.conformance_grid", __doc__, run, 200, argv, echo)


if __name__ == "__main__":
    raise SystemExit(main())
