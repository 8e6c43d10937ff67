"""The adaptive two-stage rule by simulation, for the conformance table (e2e/validation/conformance.py).

    python -m e2e.validation.conformance_adaptive --regime h200-growing --experiments 80

runs its rows alone (one regime, or all), to measure a change to the rule without the whole table."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import numpy as np

from e2e.design.point import Point
from e2e.stats import planning
from e2e.stats import variance_model as vm
from e2e.stats import verdicts as v
from e2e.validation.conformance_figures import Figure, covers_one, markdown, rate, tol
from e2e.validation.conformance_figures import _experiments as experiments_arg
from e2e.validation.simulation import DEPTHS, POINTS, REGIMES, SEED, Regime, Sim, family

# -- the adaptive stop ----------------------------------------------------------------------------
COSTS = planning.Costs(
    {"ref": 90.0, "arm": 90.0},
    {(a, p): w for a in ("ref", "arm") for p, w in zip(POINTS, (2.0, 4.0, 13.0))},
    {(a, p): r for a in ("ref", "arm") for p, r in zip(POINTS, (1.0, 2.1, 6.3))},
)


ADAPTIVE = (("cpu", 8.0), ("h200", 0.4), ("h200-growing", 0.6))


def adaptive_run(
    sim: Sim, rg: Regime, target: float
) -> tuple[list[tuple[str, int, v.Comparison]], planning.Allocation]:
    """One two-stage run: the pilot's fit, the allocation it picks, the final family over both."""
    pilot = sim.experiment(rg, 2, {"ref": {}, "arm": {}})
    f = vm.fit([(a, Point(d), s, c) for a, d, s, c in pilot])
    assert f is not None  # 2 servers per arm at every depth leave a variance to estimate
    alloc = planning.allocate(
        planning.Components.of(f),
        list(f.design.cells),
        ["ref", "arm"],
        list(POINTS),
        True,
        COSTS,
        target,
        max_extra_passes=6,
    )
    rounds = {p.depth: r for p, r in alloc.rounds.items()}
    more = [x for arm in ("ref", "arm") for x in sim.servers(rg, arm, alloc.extra_passes, {}, rounds, tag="x")]
    return family(pilot + more, "ref", rg.min_effect), alloc


def adaptive_figures(sim: Sim, n: int, regimes: Sequence[str] | None = None) -> list[Figure]:
    """Two stages, as session._replicate runs them: a pilot of 2 servers per arm, then the
    allocation planning.allocate picks from the pilot's fit (extra passes, rounds per depth), then
    the final fit over everything. No second look, and the second stage always runs (at least one
    pass, as plan_extra does even when the pilot looked narrow enough), so the stop does not select
    on a lucky variance estimate; the coverage of the final intervals, per depth too, is the check."""
    out = []
    for name, target in ADAPTIVE:
        if regimes is not None and name not in regimes:
            continue
        met, extra, minutes = [], [], []
        at: dict[int, list[bool]] = {dd: [] for dd in DEPTHS}
        for _ in range(n):
            fam, alloc = adaptive_run(sim, REGIMES[name], target)
            for _, dd, c in fam:
                at[dd].append(covers_one(c))
            met.append(all(c.ci_half_width_pct is not None and c.ci_half_width_pct <= target for *_, c in fam))
            extra.append(alloc.extra_passes)
            minutes.append(alloc.predicted_s / 60)
        d = f"A/A, {name}, pilot 2 servers per arm, target +-{target:g} %, allocation from the pilot"
        slack = tol(0.95, n)  # 3 Monte-Carlo se of n experiments (depths share servers)
        rows = [
            (f"adaptive_coverage_{name}", "95 % interval covers the true ratio (per comparison)", sum(at.values(), []))
        ]
        rows += [
            (f"adaptive_coverage_{name}_{dd}", f"95 % interval covers the true ratio at {dd // 1024}K", xs)
            for dd, xs in at.items()
        ]
        for key, what, xs in rows:
            out.append(
                Figure(key, what, d, rate(xs), len(xs), f">= 93 % (-{100 * slack:.1f} MC)", rate(xs) >= 0.93 - slack)
            )
        out += [
            Figure(f"adaptive_met_{name}", "every interval within the target after the second stage", d, rate(met), n),
            Figure(f"adaptive_extra_{name}", "mean extra passes chosen (count, not a rate)", d, float(np.mean(extra))),
            Figure(
                f"adaptive_minutes_{name}",
                "mean GPU-minutes of the second stage (count, not a rate)",
                d,
                float(np.mean(minutes)),
            ),
        ]
    return out


def main(argv: Sequence[str] | None = None, echo: Callable[[str], None] = print) -> int:
    """The adaptive rows alone, as markdown; 1 when a row misses its target."""
    ap = argparse.ArgumentParser(
        prog="python -m e2e.validation.conformance_adaptive", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--experiments", type=experiments_arg, default=80, help="runs per regime (default %(default)s)")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--regime", choices=[n for n, _ in ADAPTIVE], action="append", help="repeatable (default: all)")
    args = ap.parse_args(argv)
    figs = adaptive_figures(Sim(args.seed), args.experiments, args.regime)
    echo(markdown(figs))
    return 1 if any(f.ok is False for f in figs) else 0


if __name__ == "__main__":
    raise SystemExit(main())
