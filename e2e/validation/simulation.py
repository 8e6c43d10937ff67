"""Simulated runs with a known truth, for the conformance of the decision layer
(e2e/validation/conformance.py): cells drawn as measure.py would write them, servers and experiments
built from them, and a run's comparisons decided by the function analysis.RunAnalysis decides a
run's with (e2e/analysis/comparisons.py); for the gsm8k sign-off, discordant counts drawn and
judged by its test.

The simulation is the reference design: two arms (three in the family check), depths 1K, 8K and 32K,
64- and 8-token requests, 6 rounds per cell, per-arm-pass servers. A request of n tokens takes
0.05 s + n * tpt(depth) plus noise whose sd grows with the depth (REGIMES: per value, relative to
the 64-token request); with `heavy`, 5 % of requests are late by 10 sd x Exp(1) (heavy tails). A
server's offset (lognormal, `server_sd`) is shared by every depth it serves, and each cell adds its
own excess (`excess_sd`). Cells are drawn from pools simulated once per (effect, depth, regime,
rounds) and scaled by the server's offset: cell_stats is scale-equivariant (tested), so this equals
simulating every server's rows afresh, at a fraction of the time.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.stats import binom

from e2e.analysis import comparisons
from e2e.design.point import Point
from e2e.stats import cells as stats
from e2e.stats import planning, signoff
from e2e.stats import variance_model as vm
from e2e.stats import verdicts as v

LONG, SHORT, ROUNDS = 64, 8, 6
DEPTHS = (1024, 8192, 32768)
POINTS = tuple(Point(d) for d in DEPTHS)  # as the variance model and planning key them (batch 1)
TPT_MS = {1024: 10.9, 8192: 11.0, 32768: 11.4}  # the H200 twin's stock arm
ALPHA = 0.05
POOL = 200
SEED = 20261201

# One simulated cell as the variance model takes it: (arm, depth, server, its statistics).
SimCell = tuple[str, int, str, stats.CellStats]
# A pool's identity: (effect, depth, per-value noise by depth, heavy share, rounds).
PoolKey = tuple[float, int, tuple[float, float, float], float, int]


@dataclass(frozen=True)
class Regime:
    name: str
    server_sd: float  # log-sd of a server's offset, shared by its depths
    excess_sd: float | tuple[float, float, float]  # log-sd of a cell's own excess (server x depth), or one per depth
    noise: tuple[float, float, float]  # per-value sd / T64, by depth (grows with the context)
    heavy: float = 0.0  # share of requests late by 10 sd x Exp(1)
    min_effect: float = 2.0

    def excess(self, depth: int) -> float:
        """The cell excess's log-sd at a depth."""
        return self.excess_sd if isinstance(self.excess_sd, float) else self.excess_sd[DEPTHS.index(depth)]


REGIMES = {
    "h200": Regime("h200", 0.002, 0.0005, (0.001, 0.002, 0.005), min_effect=1.0),
    "h200-heavy": Regime("h200-heavy", 0.002, 0.0005, (0.001, 0.002, 0.005), heavy=0.05, min_effect=1.0),
    "cpu": Regime("cpu", 0.05, 0.01, (0.02, 0.03, 0.05), min_effect=5.0),
    # the server x depth excess grows with the depth (0.05 % at 1K to 0.4 % at 32K): one excess for
    # every depth covered 84-91 % at 32K
    "h200-growing": Regime("h200-growing", 0.002, (0.0005, 0.001, 0.004), (0.001, 0.002, 0.005), min_effect=1.0),
}


# -- simulated cells ----------------------------------------------------------------------------
def cell_rows(
    rng: np.random.Generator, tpt_ms: float, rel_sd: float, rounds: int = ROUNDS, heavy: float = 0.0
) -> list[dict[str, Any]]:
    """One cell's timed rows as measure.py writes them (long/short order alternating by round)."""
    sd = rel_sd * (0.05 + LONG * tpt_ms / 1e3)
    rows = []
    for r in range(rounds):
        for pos, n in enumerate((LONG, SHORT) if r % 2 == 0 else (SHORT, LONG)):
            t = 0.05 + n * tpt_ms / 1e3 + rng.normal(0.0, sd)
            if heavy and rng.random() < heavy:
                t += 10 * sd * rng.exponential()
            rows.append({"n_tokens": n, "round": r, "position": pos, "t_client_s": float(t), "valid": True})
    return rows


def scaled(cell: stats.CellStats, f: float) -> stats.CellStats:
    """The cell as a server f times slower would have measured it (every request time times f)."""
    out = copy.copy(cell)
    out.estimate, out.boot = _times(cell.estimate, f), cell.boot * f
    out.ci = (cell.ci[0] * f, cell.ci[1] * f) if cell.ci else None
    n = cell.noise
    out.noise = (
        None if n is None else stats.Noise(n.n_long, n.n_short, _times(n.scale_long, f), _times(n.scale_short, f))
    )
    return out


def _times(x: float | None, f: float) -> float | None:
    return None if x is None else x * f


class Sim:
    """Pools of simulated cells and experiments drawn from them."""

    def __init__(self, seed: int = SEED, pool: int = POOL):
        self.seed, self.pool_size = seed, pool
        self.rng = np.random.default_rng(seed)
        self.pools: dict[PoolKey, list[stats.CellStats]] = {}

    def pool(self, effect: float, depth: int, rg: Regime, rounds: int) -> list[stats.CellStats]:
        key = (round(effect, 10), depth, rg.noise, rg.heavy, rounds)
        if key not in self.pools:
            rng = np.random.default_rng(
                [
                    self.seed,
                    int(effect * 1e9) % 2**32,
                    depth,
                    rounds,
                    int(rg.heavy * 100),
                    int(1e6 * rg.noise[DEPTHS.index(depth)]),
                ]
            )
            rel = rg.noise[DEPTHS.index(depth)]
            self.pools[key] = [
                stats.cell_stats(cell_rows(rng, TPT_MS[depth] * (1 + effect), rel, rounds, rg.heavy), LONG, SHORT)
                for _ in range(self.pool_size)
            ]
        return self.pools[key]

    def servers(
        self,
        rg: Regime,
        arm: str,
        k: int,
        effects: dict[int, float],
        rounds: dict[int, int] | int = ROUNDS,
        tag: str = "",
        run_offset: float = 0.0,
    ) -> list[SimCell]:
        """k servers of one arm, each serving every depth (per-arm-pass): (arm, depth, server, cell)."""
        rounds = rounds if isinstance(rounds, dict) else {d: rounds for d in DEPTHS}
        out = []
        for s in range(k):
            u = self.rng.normal(0.0, rg.server_sd) + run_offset
            for d in DEPTHS:
                pool = self.pool(effects.get(d, 0.0), d, rg, rounds[d])
                c = pool[int(self.rng.integers(len(pool)))]
                out.append((arm, d, f"{tag}{arm}{s}", scaled(c, math.exp(u + self.rng.normal(0.0, rg.excess(d))))))
        return out

    def experiment(self, rg: Regime, k: int, arms: dict[str, dict[int, float]]) -> list[SimCell]:
        return [x for arm, eff in arms.items() for x in self.servers(rg, arm, k, eff)]


def fit(cells: Sequence[SimCell]) -> vm.Fit | None:
    """The run's variance model of these cells."""
    return vm.fit([(a, Point(d), s, c) for a, d, s, c in cells])


def family(
    cells: Sequence[SimCell], ref: str, min_effect: float, alpha: float = ALPHA, f: vm.Fit | None = None
) -> list[tuple[str, int, v.Comparison]]:
    """The run's comparisons, decided by the function RunAnalysis decides a run's with
    (e2e/analysis/comparisons.py: one fit, Holm over the arm x depth family) as (arm, depth,
    comparison); f: the fit of these cells, when the caller has it already."""
    f = f or fit(cells)
    arms = [ref] + [a for a in dict.fromkeys(c[0] for c in cells) if a != ref]

    def cells_of(arm: str, p: Point) -> list[stats.CellStats]:
        return [c[3] for c in cells if c[0] == arm and c[1] == p.depth]

    decided, _ = comparisons.decide(f, arms, POINTS, cells_of, alpha, min_effect)
    return [(arm, p.depth, c) for (arm, p), c in decided.items()]


def true_components(
    rg: Regime, arms: Sequence[str], effects: dict[str, dict[int, float]] | None = None
) -> planning.Components:
    """The simulation's truth as planning reads a fit: per-value variance relative to the difference."""
    q = {}
    for a in arms:
        for d in DEPTHS:
            e = (effects or {}).get(a, {}).get(d, 0.0)
            sd = rg.noise[DEPTHS.index(d)] * (0.05 + LONG * TPT_MS[d] / 1e3)
            diff = (LONG - SHORT) * TPT_MS[d] * (1 + e) / 1e3
            q[(a, Point(d))] = ((sd / diff) ** 2,) * 2
    top = max(rg.excess(d) for d in DEPTHS) ** 2
    w = None if isinstance(rg.excess_sd, float) else {Point(d): rg.excess(d) ** 2 / top for d in DEPTHS}
    return planning.Components(rg.server_sd**2, top, q, source="truth", weights=w)


# -- the gsm8k sign-off --------------------------------------------------------------------------
def ni_rates(
    rng: np.random.Generator, n_q: int, drop: float, psi: float, margin: float, n: int
) -> tuple[float, float, float]:
    """Simulated (pass, fail, old-rule pass) rates: counts drawn per experiment, judged by the
    test compare() uses (signoff.ni_test) and by the old rule (McNemar p >= alpha and drop <= margin)."""
    cnt = rng.multinomial(n_q, [(psi + drop) / 2, (psi - drop) / 2, 1 - psi], size=n)
    b, c = cnt[:, 0], cnt[:, 1]
    passed, failed = signoff.ni_test(b, c, n_q, margin, ALPHA)
    old = (mcnemar_p(b, c) >= ALPHA) & ((b - c) / n_q <= margin + 1e-12)
    return float(passed.mean()), float(failed.mean()), float(old.mean())


def mcnemar_p(a_only: np.ndarray, b_only: np.ndarray) -> np.ndarray:
    """signoff.mcnemar_exact, vectorised: for p = 1/2 the two-sided exact binomial p-value is
    min(1, 2 P(X <= min(a_only, b_only))), X ~ Bin(a_only + b_only, 1/2); 1 with nothing discordant."""
    d = a_only + b_only
    with np.errstate(invalid="ignore"):
        p = np.minimum(1.0, 2 * binom.cdf(np.minimum(a_only, b_only), d, 0.5))
    return np.where(d == 0, 1.0, p)
