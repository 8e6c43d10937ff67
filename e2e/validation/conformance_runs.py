"""Conformance of the run-to-run prior: two runs of identical software on two days, compared and
put in a two-run history through the functions `compare` and `history` use
(run_to_run.two_runs; changepoints.judge_series with its run_sd), and the smallest step a
history states it could have found, checked against the rate it finds that step at. Prints a
markdown table (tests/unit/stats/test_run_to_run.py asserts its rows at a smaller N):

    python -m e2e.validation.conformance_runs [--experiments N] [--seed S]

The generator is e2e/validation/simulation.py's H200 regime (2 arms, 1K/8K/32K, per-arm-pass servers)
with each run's own offset on top: per depth, the level of every arm moves by N(0, sd_level) and
the second arm's ratio by N(0, sd_ratio), at the stated prior's sds (e2e/analysis/run_prior.py's
stated(): the prior `compare` and `history` assume, imported as the truth) or at a flat sd. "Old"
rows decide as the code did before the prior (run_sd 0: the two runs' servers exchangeable). A rate target "<= 5 %" is met at 5 % + 3
Monte-Carlo standard errors; the detectable step's rate is met within 80 % +- (10 points + 3 MC
standard errors): the figure is planning's MDE at the best-placed split, an approximation.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from e2e.analysis import run_prior
from e2e.design.point import Point
from e2e.stats import changepoints
from e2e.stats import verdicts as v
from e2e.stats.changepoints import Run
from e2e.stats.run_to_run import RunSd, SimpleCell, two_runs
from e2e.validation.conformance_figures import Figure, table_main, tol
from e2e.validation.simulation import ALPHA, DEPTHS, REGIMES, SEED, Sim, scaled

ARMS = ("ref", "arm")
POINTS = [Point(d) for d in DEPTHS]
RG = REGIMES["h200"]


def prior() -> RunSd:
    """The stated prior as `compare` and `history` assume it (run_prior.stated), named short for the table."""
    return dataclasses.replace(run_prior.stated(), source="the prior")


def one_run(sim: Sim, true: RunSd, k: int, tag: str, step: float = 0.0) -> list[SimpleCell]:
    """One run of both arms, k servers each, its own offset per depth drawn from `true` (and a
    step: every arm slower by `step`)."""
    shift = {(a, d): float(sim.rng.normal(0.0, 1.0)) for a in ARMS for d in DEPTHS}
    level = {d: shift[("ref", d)] * true.sd(Point(d), True) for d in DEPTHS}
    ratio = {d: shift[("arm", d)] * true.ratio.get(Point(d), 0.0) for d in DEPTHS}
    out = []
    for arm in ARMS:
        for a, d, s, c in sim.servers(RG, arm, k, {}, tag=tag):
            off = level[d] + (ratio[d] if arm == "arm" else 0.0) + math.log1p(step)
            out.append((a, Point(d), s, scaled(c, math.exp(off))))
    return out


def _rate_row(key: str, what: str, design: str, xs: list[bool], p: float | None) -> Figure:
    r = float(np.mean(xs))
    if p is None:
        return Figure(key, what, design, r, len(xs))
    return Figure(
        key, what, design, r, len(xs), f"<= {100 * p:g} % (+{100 * tol(p, len(xs)):.1f} MC)", r <= p + tol(p, len(xs))
    )


def compare_figures(sim: Sim, n: int, k: int = 2) -> list[Figure]:
    """Identical software, two days: any row "slower" or "faster" (family-wise, Holm over 6)."""
    out = []
    cases = [
        ("old_prior", "old rule (no run-to-run sd)", prior(), None, 0.5, None),
        ("prior", "with the stated prior", prior(), prior(), 0.5, ALPHA),
        ("prior_1", "with the stated prior", prior(), prior(), 1.0, ALPHA),
        ("half_prior", "with the stated prior", _scaled(prior(), 0.5), prior(), 0.5, ALPHA),
        ("old_1pct", "old rule (no run-to-run sd)", RunSd.flat(0.01, "1 % flat"), None, 0.5, None),
        ("flag_1pct", "--run-sd 1", RunSd.flat(0.01, "1 % flat"), RunSd.flat(0.01, "flag"), 0.5, ALPHA),
    ]
    for key, rule, true, assumed, me, target in cases:
        hit = []
        for _ in range(n):
            _, rows, _ = two_runs(
                one_run(sim, true, k, "A"), one_run(sim, true, k, "B"), ARMS, POINTS, "ref", ALPHA, me, assumed
            )
            hit.append(any(r.comparison.decision in (v.SLOWER, v.FASTER) for r in rows))
        d = f"A/A across runs, {k} + {k} servers, true run sd {true.source}, min effect {me:g} %"
        out.append(_rate_row(f"cmp_{key}", f'compare: false "slower"/"faster", {rule}', d, hit, target))
    return out


def history_figures(sim: Sim, n: int, k: int = 2) -> list[Figure]:
    """A two-run history of identical software: any step in any of the 6 series (exit 1 or worse)."""
    out = []
    cases = [
        ("old_prior", "old rule (no run-to-run sd)", prior(), None, None),
        ("prior", "with the stated prior", prior(), prior(), ALPHA),
        ("old_1pct", "old rule (no run-to-run sd)", RunSd.flat(0.01, "1 % flat"), None, None),
    ]
    for key, rule, true, assumed, target in cases:
        hit = []
        for _ in range(n):
            runs = [one_run(sim, true, k, t) for t in ("r0", "r1")]
            found = False
            for arm in ARMS:
                for p in POINTS:
                    series: list[Run] = [[c for a, q, _, c in r if a == arm and q == p] for r in runs]
                    sd = assumed.sd(p, arm == "ref") if assumed else 0.0
                    res = changepoints.judge_series(series, ALPHA, 0.5, n_series=6, run_sd=sd)
                    found |= bool(res.steps)
            hit.append(found)
        d = f"2 runs x {k} servers, true run sd {true.source}, min effect 0.5 %, 6 series"
        out.append(_rate_row(f"hist_{key}", f"two-run history: false step, {rule}", d, hit, target))
    return out


def detectable_figures(sim: Sim, n: int, runs: int = 8, k: int = 3, sd: float = 0.005) -> list[Figure]:
    """History over `runs` runs (one arm, 8K): the smallest step it says it could find (median over
    flat series), and how often a step of that size in the middle is found within one run."""
    true = RunSd.flat(sd, "truth")
    p = Point(8192)

    def series(step: float) -> list[Run]:
        return [
            [
                c
                for a, q, _, c in one_run(sim, true, k, f"r{i}", step if i >= runs // 2 else 0.0)
                if a == "ref" and q == p
            ]
            for i in range(runs)
        ]

    flat = [changepoints.judge_series(series(0.0), ALPHA, 1.0).detectable_pct for _ in range(max(10, n // 4))]
    mde = float(np.median([m for m in flat if m]))
    found = []
    for _ in range(n):
        res = changepoints.judge_series(series(mde / 100), ALPHA, 1.0)
        found.append(any(abs(c.index - runs // 2) <= 1 and c.decision == v.SLOWER for c in res.steps))
    d = f"{runs} runs x {k} servers, run sd {100 * sd:g} %, min effect 1 %, step of the stated size mid-series"
    r, t = float(np.mean(found)), 0.10 + tol(0.8, len(found))
    return [
        Figure("detectable_pct", "history: the smallest step it could have found (median, MDE %)", d, mde),
        Figure(
            "detectable_found",
            "history: that step found within one run",
            d,
            r,
            len(found),
            f"80 % +- {100 * t:.0f}",
            abs(r - 0.8) <= t,
        ),
    ]


def _scaled(r: RunSd, f: float) -> RunSd:
    return RunSd({p: f * s for p, s in r.level.items()}, {p: f * s for p, s in r.ratio.items()}, f"{f:g} x {r.source}")


def run(n: int = 400, seed: int = SEED) -> list[Figure]:
    sim = Sim(seed)
    return compare_figures(sim, n) + history_figures(sim, n) + detectable_figures(sim, max(20, n // 4))


def main(argv: Sequence[str] | None = None, echo: Callable[[str], None] = print) -> int:
    return table_main("python -m e2e.validation.conformance_runs", __doc__, run, 400, argv, echo)


if __name__ == "__main__":
    raise SystemExit(main())
