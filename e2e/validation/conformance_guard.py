"""Conformance of the prefill guard: simulated runs with server timings (e2e/validation/sim_server_timings.py)
and a known truth, through the functions a run uses (prefill_guard.judge per arm and depth, one
estimator per depth, then cell_stats -> variance_model.fit -> verdicts, as simulation.family decides). Prints the figures as a
markdown table (tests/unit/validation/test_conformance_guard.py asserts them):

    python -m e2e.validation.conformance_guard [--experiments N] [--seed S]

A/A designs, 3 servers per arm, min effect 1 %: the reference arm's server reports its prefill
well, the other arm's under the fault (with missing values, both arms). Beside each guard row, the
run-wide guard it replaced (`old rule`) on the same runs. Rates carry 95 % Monte-Carlo intervals;
"<= 5 %" is met up to 3 Monte-Carlo se (conformance.tol), coverage ">= 93 %" likewise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from e2e.stats import verdicts as v
from e2e.stats.estimate import CORRECTED
from e2e.validation import sim_server_timings as sst
from e2e.validation import simulation
from e2e.validation.conformance_figures import Figure, covers_one, rate, table_main, tol

K, MIN_EFFECT = 3, 1.0
DECIDED = (v.SLOWER, v.FASTER)


def _reference_of(fault: sst.Fault) -> sst.Fault:
    """The reference arm's timings: well reported, with the fault's missing values and jitter."""
    return sst.Fault("reference of " + fault.name, missing=fault.missing, jitter_32k_s=fault.jitter_32k_s)


def fault_figures(ts: sst.TimedSim, fault: sst.Fault, n: int) -> tuple[list[Figure], list[float]]:
    """The guard's rows for one fault, and the 32K half-widths under it (for the missing-value row)."""
    d = f"A/A, {fault.name} on one arm, {K} servers per arm, min effect {MIN_EFFECT:g} %"
    new_dec, old_dec, trusted, hw = [], [], [], []
    cover: dict[int, list[bool]] = {dd: [] for dd in simulation.DEPTHS}
    for _ in range(n):
        cells = ts.experiment(K, {"ref": _reference_of(fault), "arm": fault})
        chosen, how = sst.new_rule(cells, MIN_EFFECT)
        fam = simulation.family(chosen, "ref", MIN_EFFECT)
        new_dec.append(any(c.decision in DECIDED for *_, c in fam))
        for _, dd, c in fam:
            cover[dd].append(covers_one(c))
            if dd == simulation.DEPTHS[-1]:
                hw.append(c.ci_half_width_pct if c.ci_half_width_pct is not None else float("nan"))
        trusted.append(how[("arm", simulation.DEPTHS[-1])] == CORRECTED)
        old = simulation.family(sst.old_rule(cells), "ref", MIN_EFFECT)
        old_dec.append(any(c.decision in DECIDED for *_, c in old))
    slug = fault.name.replace(" ", "_").replace("%", "pct").replace("+", "").replace(",", "")
    out = [
        _at_most(f"guard_aa_{slug}", '"slower"/"faster" anywhere (false, family-wise)', d, new_dec),
        Figure(f"guard_old_{slug}", '"slower"/"faster" anywhere, old run-wide guard', d, rate(old_dec), n),
        Figure(f"guard_trusted_{slug}", "the faulty arm's 32K corrected (share of runs)", d, rate(trusted), n),
    ]
    for dd, xs in cover.items():
        r, slack = rate(xs), tol(0.95, len(xs))
        out.append(
            Figure(
                f"guard_cover_{slug}_{dd}",
                f"95 % interval covers the true ratio at {dd}",
                d,
                r,
                len(xs),
                f">= 93 % (-{100 * slack:.1f} MC)",
                r >= 0.93 - slack,
            )
        )
    return out, hw


def missing_figures(ts: sst.TimedSim, n: int, hw_clean: Sequence[float]) -> list[Figure]:
    """2 % missing prefill times: the 32K half-width keeps the corrected estimator's (new rule),
    against the run-wide fallback to the plain estimate (old rule)."""
    fault = sst.FAULTS["2 % missing"]
    d = f"A/A, 2 % of prefill times missing in both arms, {K} servers per arm"
    new: list[float] = []
    old: list[float] = []
    for _ in range(n):
        cells = ts.experiment(K, {"ref": fault, "arm": fault})
        for rule, into in ((sst.new_rule(cells, MIN_EFFECT)[0], new), (sst.old_rule(cells), old)):
            c = next(c for _, dd, c in simulation.family(rule, "ref", MIN_EFFECT) if dd == simulation.DEPTHS[-1])
            into.append(c.ci_half_width_pct if c.ci_half_width_pct is not None else float("nan"))
    base = float(np.nanmedian(hw_clean))
    r_new, r_old = float(np.nanmedian(new)) / base, float(np.nanmedian(old)) / base
    what = "median 32K half-width over the no-missing one's (ratio, count)"
    return [
        Figure("guard_missing_hw", what, d, r_new, None, "<= 1.15", r_new <= 1.15),
        Figure("guard_missing_hw_old", what + ", old run-wide guard", d, r_old, None),
    ]


def _at_most(key: str, what: str, design: str, xs: list[bool], p: float = simulation.ALPHA) -> Figure:
    r = rate(xs)
    return Figure(
        key, what, design, r, len(xs), f"<= {100 * p:g} % (+{100 * tol(p, len(xs)):.1f} MC)", r <= p + tol(p, len(xs))
    )


def run(n: int = 400, seed: int = simulation.SEED) -> list[Figure]:
    ts = sst.TimedSim(seed)
    out: list[Figure] = []
    clean: list[float] = []
    for name, fault in sst.FAULTS.items():
        figs, hw = fault_figures(ts, fault, n)
        out += figs
        if name == "noise":
            clean = hw
    return out + missing_figures(ts, n, clean)


def main(argv: Sequence[str] | None = None, echo: Callable[[str], None] = print) -> int:
    return table_main("python -m e2e.validation.conformance_guard", __doc__, run, 400, argv, echo)


if __name__ == "__main__":
    raise SystemExit(main())
