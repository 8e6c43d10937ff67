"""Simulated server timings, for the prefill guard's conformance (e2e/validation/conformance_guard.py).

The cells of e2e/validation/simulation.py (cell_rows: what the client waits for after the prefill) with a
prefill added to every request: the client waits PREFILL_S plus a jitter (JITTER_S sd, by depth,
the H200's 32K prefill ~2.7 s with a 4-9 ms sd), and the server reports that same prefill with a
small error of its own (REPORT_SD_S) under a Fault: a constant offset on every report, a
length-dependent one (the long request's prefill reported too long at 32K), or reports that are
missing. The per-value noise left after the correction (REGIME) is calibrated on the committed H200
rows (a 32K cell's corrected half-width +-0.3-0.5 %, 1K and 8K +-0.1-0.2 %).

A run's choice is made per arm and depth by prefill_guard.judge, then one estimator per depth, as
analysis/estimator.py makes it;
`old_rule` is the run-wide guard it replaced (every row with a prefill time and every cell's
corrected estimate agreeing with its plain one, else the plain estimate for the whole run), kept
to show what the new one fixes. Pools of cells are simulated once per (fault, depth, effect) and
scaled by each server's offset: cell_stats is scale-equivariant and judge scale-invariant.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from e2e.stats import cells as stats
from e2e.stats import prefill_guard
from e2e.stats.estimate import CLIENT, CORRECTED
from e2e.validation import simulation
from e2e.validation.simulation import DEPTHS, LONG, ROUNDS, SHORT, TPT_MS, Regime, SimCell

PREFILL_S = {1024: 0.08, 8192: 0.6, 32768: 2.7}
JITTER_S = {1024: 0.0007, 8192: 0.002, 32768: 0.003}
REPORT_SD_S = 0.0002
REGIME = Regime("h200-timed", 0.002, 0.0005, (0.0007, 0.001, 0.003), min_effect=1.0)
POOL = 150


@dataclass(frozen=True)
class Fault:
    name: str
    constant_s: float = 0.0  # added to every prefill the server reports
    long_extra_s: float = 0.0  # added to the long request's reported prefill, at 32K only
    missing: float = 0.0  # share of prefill times not reported
    jitter_32k_s: float | None = None  # the prefill's jitter at 32K, when not JITTER_S's


FAULTS = {
    f.name: f
    for f in (
        Fault("noise"),
        Fault("constant +20 ms", constant_s=0.020),
        Fault("long +6 ms at 32K", long_extra_s=0.006),
        Fault("long +10 ms at 32K", long_extra_s=0.010),
        Fault("2 % missing", missing=0.02),
        Fault("noise, 6 ms prefill jitter at 32K", jitter_32k_s=0.006),
        Fault("long +6 ms at 32K, 6 ms prefill jitter", long_extra_s=0.006, jitter_32k_s=0.006),
    )
}


@dataclass(frozen=True)
class TimedCell:
    """One simulated cell: its rows, and its statistics under each estimator."""

    rows: list[dict[str, Any]]
    corrected: stats.CellStats
    plain: stats.CellStats

    def scaled(self, f: float) -> TimedCell:
        """As a server f times slower would have measured it (the rows stay: judge reads ratios)."""
        return TimedCell(self.rows, simulation.scaled(self.corrected, f), simulation.scaled(self.plain, f))


# One simulated cell of a run: (arm, depth, server, the cell).
Timed = tuple[str, int, str, TimedCell]


def timed_rows(
    rng: np.random.Generator, depth: int, effect: float, fault: Fault, rounds: int = ROUNDS, rg: Regime = REGIME
) -> list[dict[str, Any]]:
    """One cell's rows as measure.py writes them, with the client's prefill and the server's report of it."""
    rows = simulation.cell_rows(rng, TPT_MS[depth] * (1 + effect), rg.noise[DEPTHS.index(depth)], rounds, rg.heavy)
    extra = fault.long_extra_s if depth == DEPTHS[-1] else 0.0
    jitter = fault.jitter_32k_s if depth == DEPTHS[-1] and fault.jitter_32k_s is not None else JITTER_S[depth]
    for r in rows:
        pre = PREFILL_S[depth] + rng.normal(0.0, jitter)
        r["t_client_s"] += pre
        told = pre + rng.normal(0.0, REPORT_SD_S) + fault.constant_s + (extra if r["n_tokens"] == LONG else 0.0)
        r["server_prefill_s"] = None if rng.random() < fault.missing else float(told)
    return rows


class TimedSim:
    """Pools of simulated cells with server timings, and runs drawn from them."""

    def __init__(self, seed: int = simulation.SEED, pool: int = POOL, rg: Regime = REGIME):
        self.seed, self.pool_size, self.rg = seed, pool, rg
        self.rng = np.random.default_rng([seed, 34])
        self.pools: dict[tuple[str, int, float], list[TimedCell]] = {}

    def pool(self, fault: Fault, depth: int, effect: float) -> list[TimedCell]:
        key = (fault.name, depth, round(effect, 10))
        if key not in self.pools:
            rng = np.random.default_rng([self.seed, depth, int(effect * 1e9) % 2**32, *map(ord, fault.name)])
            out = []
            for _ in range(self.pool_size):
                rows = timed_rows(rng, depth, effect, fault, rg=self.rg)
                out.append(
                    TimedCell(
                        rows,
                        stats.cell_stats(rows, LONG, SHORT, estimator=CORRECTED),
                        stats.cell_stats(rows, LONG, SHORT),
                    )
                )
            self.pools[key] = out
        return self.pools[key]

    def experiment(
        self, k: int, faults: Mapping[str, Fault], effects: Mapping[str, Mapping[int, float]] | None = None
    ) -> list[Timed]:
        """k servers per arm (arm -> its servers' fault), each serving every depth (per-arm-pass)."""
        out = []
        for arm, fault in faults.items():
            for s in range(k):
                u = self.rng.normal(0.0, self.rg.server_sd)
                for d in DEPTHS:
                    pool = self.pool(fault, d, (effects or {}).get(arm, {}).get(d, 0.0))
                    c = pool[int(self.rng.integers(len(pool)))]
                    out.append((arm, d, f"{arm}{s}", c.scaled(math.exp(u + self.rng.normal(0.0, self.rg.excess_sd)))))
        return out


def new_rule(cells: list[Timed], min_effect_pct: float) -> tuple[list[SimCell], dict[tuple[str, int], str]]:
    """Each arm and depth judged by prefill_guard.judge, then one estimator per depth (the plain one
    where any arm there is on it, as analysis/estimator.py does): the cells under it, and the choices."""
    chosen: dict[tuple[str, int], str] = {}
    for arm, d in dict.fromkeys((a, dd) for a, dd, *_ in cells):
        mine = [c for a, dd, _, c in cells if (a, dd) == (arm, d)]
        t = prefill_guard.judge([(c.rows, c.corrected, c.plain) for c in mine], LONG, SHORT, min_effect_pct)
        chosen[(arm, d)] = t.estimator
    plain_at = prefill_guard.plain_points(chosen)
    chosen = {(a, d): CLIENT if d in plain_at else e for (a, d), e in chosen.items()}
    return [(a, d, s, c.corrected if chosen[(a, d)] == CORRECTED else c.plain) for a, d, s, c in cells], chosen


def old_rule(cells: list[Timed]) -> list[SimCell]:
    """The run-wide guard the per-point one replaced: all corrected or all plain."""
    whole = all(
        all(r.get("server_prefill_s") is not None for r in c.rows) and c.corrected.client_agrees is not False
        for *_, c in cells
    )
    return [(a, d, s, c.corrected if whole else c.plain) for a, d, s, c in cells]
