"""Conformance of the decision layer: simulated runs with a known truth, through the functions a run
uses (stats.cell_stats -> verdicts.pooled_comparison -> verdicts.decide_family; signoff's
non-inferiority test on simulated counts; changepoints.find_change_points). Prints the figures as
a markdown table (tests/test_conformance.py asserts them):

    python -m e2e.conformance [--experiments N] [--seed S]

The simulation: a request of n tokens takes (PREFILL_S + n * 10 ms) * server offset * exp(noise);
noise is lognormal with a log-sd drawn per cell between 2 % and 5 %; server offsets are lognormal
(log-sd 5 % or 20 %), one per cell (each cell is a fresh server). Cells are LONG=64 / SHORT=8
tokens, 10 rounds. A cell's statistics are computed once per simulated cell (pools of POOL cells
per true per-token cost) and a server offset is applied by scaling the cell's estimate and
bootstrap: cell_stats is scale-equivariant (tested), so this equals simulating the rows of every
server afresh, at a fraction of the time. Every rate comes with its 95 % Monte-Carlo (Wilson)
interval; a target "<= 5 %" is met when the rate is at most 5 % + 3 Monte-Carlo standard errors.
"""
from __future__ import annotations

import argparse
import copy
import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from scipy.stats import binom

from e2e import changepoints, signoff, stats, verdicts as v

TPT_MS, PREFILL_S, LONG, SHORT, ROUNDS = 10.0, 0.02, 64, 8, 10
REQ_NOISE = (0.02, 0.05)
SPREADS = (0.05, 0.20)
SERVERS = (1, 2, 4)
ALPHA, MIN_EFFECT = 0.05, 2.0
POOL = 600
SEED = 20261201


# -- simulated cells ----------------------------------------------------------------------------
def cell_rows(rng: np.random.Generator, tpt_ms: float = TPT_MS, offset: float = 1.0) -> list[dict[str, Any]]:
    """One cell's timed rows as measure.py writes them (long/short order alternating by round)."""
    sd = rng.uniform(*REQ_NOISE)
    noise = np.exp(rng.normal(0.0, sd, size=2 * ROUNDS))
    rows = []
    for r in range(ROUNDS):
        for pos, n in enumerate((LONG, SHORT) if r % 2 == 0 else (SHORT, LONG)):
            t = (PREFILL_S + n * tpt_ms / 1e3) * offset * noise[2 * r + pos]
            rows.append({"n_tokens": n, "round": r, "position": pos, "t_client_s": float(t), "valid": True})
    return rows


def scaled(cell: stats.CellStats, f: float) -> stats.CellStats:
    """The cell as a server f times slower would have measured it (every request time times f).
    A shallow copy keeps the cached log_se, which a common factor does not change."""
    cell.log_se                      # computed (and cached) on the pool cell before the copy
    out = copy.copy(cell)
    out.estimate, out.boot = cell.estimate * f, cell.boot * f
    out.ci = (cell.ci[0] * f, cell.ci[1] * f) if cell.ci else None
    return out


class Sim:
    """Pools of simulated cells (one per true per-token cost) and experiments drawn from them."""

    def __init__(self, seed: int = SEED, pool: int = POOL):
        self.seed, self.pool_size = seed, pool
        self.rng = np.random.default_rng(seed)
        self.pools: dict[float, list[stats.CellStats]] = {}

    def pool(self, effect: float) -> list[stats.CellStats]:
        key = round(effect, 10)
        if key not in self.pools:
            rng = np.random.default_rng([self.seed, int(key * 1e9)])
            self.pools[key] = [stats.cell_stats(cell_rows(rng, TPT_MS * (1 + effect)), LONG, SHORT)
                               for _ in range(self.pool_size)]
        return self.pools[key]

    def experiment(self, groups: list[tuple[float, int]], spread: float) -> list[list[stats.CellStats]]:
        """One experiment's servers: per (effect, k) group, k pool cells (all distinct within the
        experiment), each with its own lognormal server offset."""
        need: dict[float, int] = {}
        for e, k in groups:
            need[e] = need.get(e, 0) + k
        picks = {e: list(self.rng.choice(self.pool_size, size=k, replace=False)) for e, k in need.items()}
        out = []
        for e, k in groups:
            idx, picks[e] = picks[e][:k], picks[e][k:]
            offs = np.exp(self.rng.normal(0.0, spread, size=k))
            pool = self.pool(e)
            out.append([scaled(pool[i], f) for i, f in zip(idx, offs)])
        return out

    def comparison(self, effect: float, k: int, spread: float, min_effect: float = MIN_EFFECT) -> v.Comparison:
        ref, arm = self.experiment([(0.0, k), (effect, k)], spread)
        c = v.pooled_comparison(ref, arm, ALPHA, min_effect)
        v.decide_family([c], ALPHA)
        return c

    def cell_log_sd(self, spread: float) -> float:
        """The true sd of one server's log estimate: offsets plus the cells' own noise."""
        x = np.log([c.estimate for c in self.pool(0.0)])
        return math.sqrt(spread ** 2 + float(np.var(x, ddof=1)))


# -- figures ------------------------------------------------------------------------------------
@dataclass
class Figure:
    key: str
    what: str
    design: str
    value: float
    n: int | None = None            # experiments behind a rate (None: a computed value)
    target: str = ""
    ok: bool | None = None          # None: reported, no target

    @property
    def interval(self) -> tuple[float, float] | None:
        if self.n is None:
            return None
        return signoff.proportion_interval(round(self.value * self.n), self.n, 0.95, "wilson")


def tol(p: float, n: int) -> float:
    """The stated Monte-Carlo tolerance: 3 standard errors of a rate p over n experiments."""
    return 3 * math.sqrt(p * (1 - p) / n)


def _rate(xs: list[bool]) -> float:
    return float(np.mean(xs)) if xs else float("nan")


def _at_most(key: str, what: str, design: str, xs: list[bool], p: float) -> Figure:
    r = _rate(xs)
    return Figure(key, what, design, r, len(xs), f"<= {100 * p:g} % (+{100 * tol(p, len(xs)):.1f} MC)",
                  r <= p + tol(p, len(xs)))


def _at_least(key: str, what: str, design: str, xs: list[bool], p: float) -> Figure:
    return Figure(key, what, design, _rate(xs), len(xs), "always" if p == 1 else f">= {100 * p:g} %", _rate(xs) >= p)


def between_arm_figures(sim: Sim, n: int) -> list[Figure]:
    out = []
    decided = (v.SLOWER, v.FASTER)
    for k in SERVERS:
        for spread in SPREADS:
            d = f"A/A, {k} server(s) per arm, spread {100 * spread:g} %"
            cs = [sim.comparison(0.0, k, spread) for _ in range(n)]
            tag = f"k{k}_s{round(100 * spread)}"
            if k == 1:
                out.append(_at_least(f"aa_insufficient_{tag}", '"insufficient replication"', d,
                                     [c.decision == v.INSUFFICIENT_REPLICATION for c in cs], 1.0))
                continue
            out.append(_at_most(f"aa_decided_{tag}", '"slower"/"faster" (false)', d,
                                [c.decision in decided for c in cs], ALPHA))
            out.append(_at_least(f"aa_coverage_{tag}", "95 % interval covers the true ratio", d,
                                 [c.ci[0] <= 1 <= c.ci[1] for c in cs], 0.93))
            out.append(Figure(f"aa_mde_{tag}", "median reported MDE, %", d,
                              float(np.median([c.mde_pct for c in cs]))))
    d = "10 % slower, 8 servers per arm, spread 5 %"
    out.append(_at_least("slow10_k8_s5", '"slower"', d,
                         [sim.comparison(0.10, 8, 0.05).decision == v.SLOWER for _ in range(n)], 0.80))
    # MDE: at the MDE of the design's true se, the test rejects 80 % of the time
    k, spread = 4, 0.05
    se_true = sim.cell_log_sd(spread) * math.sqrt(2 / k)
    mde = v.mde_pct(se_true, 2 * k - 2, ALPHA)
    d = f"true change = MDE at the true se ({mde:.1f} %), 4 servers per arm, spread 5 %"
    r = _rate([sim.comparison(mde / 100, k, spread).p < ALPHA for _ in range(n)])
    out.append(Figure("mde_power_true_se", "p < alpha (power)", d, r, n, f"80 % +- {100 * (tol(0.8, n) + 0.02):.1f}",
                      abs(r - 0.80) <= tol(0.8, n) + 0.02))
    med = next(f.value for f in out if f.key == "aa_mde_k4_s5")
    d = f"true change = median reported MDE ({med:.1f} %), 4 servers per arm, spread 5 %"
    r = _rate([sim.comparison(med / 100, k, spread).p < ALPHA for _ in range(n)])
    out.append(Figure("mde_power_median", "p < alpha (power)", d, r, n,
                      "65 to 90 % (the median sd is below the true sd)", 0.65 <= r <= 0.90))
    # TOST: a true change at the margin is called "equivalent" at most alpha of the time
    d = "true change 10 % = the margin (min_effect 10 %), 8 servers per arm, spread 5 %"
    out.append(_at_most("tost_size_k8", '"equivalent" (false)', d,
                        [sim.comparison(0.10, 8, 0.05, 10.0).decision == v.EQUIVALENT for _ in range(n)], ALPHA))
    d = "A/A, min_effect 10 %, 8 servers per arm, spread 5 %"
    out.append(Figure("tost_power_k8", '"equivalent"', d,
                      _rate([sim.comparison(0.0, 8, 0.05, 10.0).decision == v.EQUIVALENT for _ in range(n)]), n))
    out += family_figures(sim, n)
    return out


def family_figures(sim: Sim, n: int) -> list[Figure]:
    """A/A family: 3 arms x 2 depths against one reference, 4 servers per arm, spread 20 %."""
    d = "A/A family, 3 arms x 2 depths, 4 servers per arm, spread 20 %"
    any_holm, any_raw = [], []
    for _ in range(n):
        fam = []
        for _depth in range(2):
            ref, *arms = sim.experiment([(0.0, 4)] * 4, 0.20)
            fam += [v.pooled_comparison(ref, arm, ALPHA, MIN_EFFECT) for arm in arms]
        any_raw.append(any(c.decision in (v.SLOWER, v.FASTER) for c in fam))
        v.decide_family(fam, ALPHA, "holm")
        any_holm.append(any(c.decision in (v.SLOWER, v.FASTER) for c in fam))
    return [_at_most("family_holm", "any false decision, Holm", d, any_holm, ALPHA),
            Figure("family_raw", "any false decision, uncorrected", d, _rate(any_raw), n)]


def changepoint_figures(sim: Sim, n: int, runs: int = 8, k: int = 4, spread: float = 0.05) -> list[Figure]:
    d = f"{runs} runs x {k} servers, spread {100 * spread:g} %"
    step = runs // 2
    flat, found, exact, extra = [], [], [], []
    for _ in range(n):
        flat.append(bool(changepoints.find_change_points(sim.experiment([(0.0, k)] * runs, spread),
                                                         ALPHA, MIN_EFFECT)))
        series = sim.experiment([(0.0 if i < step else 0.10, k) for i in range(runs)], spread)
        cps = changepoints.find_change_points(series, ALPHA, MIN_EFFECT)
        near = [c for c in cps if abs(c.index - step) <= 1 and c.decision == v.SLOWER]
        found.append(bool(near))
        exact.append(any(c.index == step for c in near))
        extra.append(len(cps) > len(near[:1]))
    return [_at_most("cp_flat", "flat series: any change point", d, flat, ALPHA),
            _at_least("cp_step_found", '10 % step: a "slower" step within one run of it', d, found, 0.90),
            Figure("cp_step_exact", "10 % step: located at exactly the right run", d, _rate(exact), n),
            Figure("cp_step_extra", "10 % step: some other (false) step as well", d, _rate(extra), n)]


def _ni_rates(rng: np.random.Generator, n_q: int, drop: float, psi: float, margin: float, n: int
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


def gsm8k_figures(n: int, seed: int = SEED) -> list[Figure]:
    rng = np.random.default_rng([seed, 8])
    m, out = 0.01, []
    for n_q, psi in ((1319, 0.05), (100, 0.10), (10, 0.20)):
        for drop, label in ((m, "= margin"), (1.5 * m, "1.5 x margin")):
            d = f"{n_q} questions, true drop {100 * drop:g} pts ({label}), discordance {100 * psi:g} %, margin 1 pt"
            p, _, old = _ni_rates(rng, n_q, drop, psi, m, n)
            key = f"ni_{n_q}_{'m' if drop == m else 'm15'}"
            out.append(Figure(key, "pass (false)", d, p, n, f"<= 5 % (+{100 * tol(0.05, n):.1f} MC)",
                              p <= ALPHA + tol(ALPHA, n)))
            out.append(Figure(key + "_old", "pass under the old rule (McNemar p >= alpha)", d, old, n))
    for n_q in (10, 100, 1319):
        worst = max(signoff.pass_probability(n_q, (s + m) / 2, (s - m) / 2, m, ALPHA)["pass"]
                    for s in np.linspace(m, 1, 41))
        out.append(Figure(f"ni_exact_{n_q}", "exact size, worst discordance (41 rates)",
                          f"{n_q} questions, margin 1 pt", worst, None, "<= 5 %", worst <= ALPHA))
    for psi in (0.02, 0.05):
        d = f"A/A, 1319 questions, discordance {100 * psi:g} %, margin 1 pt"
        p, f, _ = _ni_rates(rng, 1319, 0.0, psi, m, n)
        out.append(Figure(f"aa_fail_{round(100 * psi)}", '"fail"', d, f, n, f"<= 5 % (+{100 * tol(0.05, n):.1f} MC)",
                          f <= ALPHA + tol(ALPHA, n)))
        out.append(Figure(f"aa_pass_{round(100 * psi)}", '"pass" (power)', d, p, n))
    need = signoff.questions_needed(m, ALPHA, 0.80, 0.02)
    d = f"A/A at questions_needed(1 pt, discordance 2 %) = {need} questions"
    p, _, _ = _ni_rates(rng, need, 0.0, 0.02, m, n)
    out.append(Figure("ni_needed_power", '"pass" (power)', d, p, n, f"80 % +- {100 * (tol(0.8, n) + 0.03):.1f}",
                      abs(p - 0.80) <= tol(0.8, n) + 0.03))
    return out


def run(n: int = 500, seed: int = SEED) -> list[Figure]:
    sim = Sim(seed)
    return between_arm_figures(sim, n) + changepoint_figures(sim, max(100, n // 2)) + gsm8k_figures(2 * n, seed)


def markdown(figs: list[Figure]) -> str:
    def pct(x: float) -> str:
        return f"{100 * x:.1f} %"
    lines = ["| figure | design | value | MC 95 % interval | target | met |", "|---|---|---|---|---|---|"]
    for f in figs:
        val = f"{f.value:.2f} %" if "MDE" in f.what else pct(f.value)
        iv = f.interval
        lines.append(f"| {f.what} | {f.design} | {val} | "
                     f"{f'{pct(iv[0])} to {pct(iv[1])} (n {f.n})' if iv else '-'} | {f.target or '-'} | "
                     f"{'-' if f.ok is None else 'yes' if f.ok else '**no**'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None, echo: Callable[[str], None] = print) -> int:
    ap = argparse.ArgumentParser(prog="python -m e2e.conformance", description=__doc__.split("\n\n")[0])
    ap.add_argument("--experiments", type=int, default=2000, help="experiments per design (default %(default)s)")
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args(argv)
    if args.experiments < 10:
        ap.error("--experiments must be >= 10")
    figs = run(args.experiments, args.seed)
    echo(markdown(figs))
    return 0 if all(f.ok is not False for f in figs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
