"""Between-arm comparisons of decode ms per token, and the decisions drawn from them. Pure, no I/O.

The model (README.md, "Between arms", says it at length):

* One cell = one server = one replicate. Across server starts the same setup moved by 16 % (CPU)
  to 25 % (H200), far more than the noise inside one server, so requests are never replicates.
* pooled_comparison: arm vs reference at one depth, on the log cell estimates. The two arms share
  one between-server variance (the servers are started the same way; only the arm's code differs),
  estimated by the pooled two-sample t with df = k_ref + k_arm - 2 (Welch with two cells per arm
  has ~1-2 df and no power). The variance is floored by the mean within-cell bootstrap variance
  of a log estimate: two servers that happen to agree must not beat their own noise.
* Fewer than 2 servers in an arm: the between-server variance is unknown, so nothing is decided
  ("insufficient replication"); a within-server interval is shown, labelled as such.
* Decision (decide): "slower"/"faster" iff p < alpha AND |ratio - 1| >= min_effect_pct / 100;
  "equivalent" iff the TOST p against +-log(1 + min_effect_pct / 100) is < alpha (the (1 - 2 alpha)
  interval lies inside the margin); else "inconclusive", never "no change". decide_family
  re-decides a whole family (every arm x depth) on Holm-adjusted p's.
* MDE: the smallest true change the two-sided test detects with 80 % power at this se and df
  (noncentral t). servers_needed: servers per arm for min_effect_pct at 80 % power.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Sequence

import numpy as np
from scipy import optimize, special
from scipy import stats as st

from e2e.errors import UserError
from e2e.stats import LEVEL, SEED, CellStats, percentile_ci

SLOWER, FASTER, EQUIVALENT, INCONCLUSIVE = "slower", "faster", "equivalent", "inconclusive"
INSUFFICIENT_REPLICATION, NODATA = "insufficient replication", "insufficient data"
VERDICTS = (SLOWER, FASTER, EQUIVALENT, INCONCLUSIVE, INSUFFICIENT_REPLICATION, NODATA)
BETWEEN, WITHIN, WITHIN_ONE = "between-server", "within-server", "within-server (one server)"
POWER = 0.80
MAX_SERVERS = 100_000     # planning answers above this are None (nothing practical)
METHODS = ("holm", "bonferroni", "none")


# -- t helpers (scipy.special: these run thousands of times in the conformance suite) --------
def _tq(p: float, df: float) -> float:
    return float(special.ndtri(p)) if math.isinf(df) else float(special.stdtrit(df, p))


def _tcdf(x: float, df: float) -> float:
    return float(special.ndtr(x)) if math.isinf(df) else float(special.stdtr(df, x))


def _check_alpha(alpha: float) -> None:
    if not 0 < alpha < 0.5:
        raise UserError(f"alpha must be in (0, 0.5), got {alpha}")


# -- power and planning -----------------------------------------------------------------------
@lru_cache(maxsize=4096)
def noncentrality_for_power(df: int, alpha: float, power: float = POWER) -> float:
    """lambda such that the two-sided t test at alpha with df degrees of freedom rejects with
    probability `power` when the true effect is lambda standard errors (noncentral t)."""
    c = _tq(1 - alpha / 2, df)

    def gap(lam: float) -> float:
        # scipy's noncentral t returns NaN in far tails (seen: the lower tail at df 2, lambda 8):
        # there the lower tail is ~0 and the upper tail ~1 beyond the critical value.
        up, lo = float(st.nct.sf(c, df, lam)), float(st.nct.cdf(-c, df, lam))
        up = (1.0 if lam > c else 0.0) if math.isnan(up) else up
        return up + (0.0 if math.isnan(lo) else lo) - power
    hi = c + 2.0
    while gap(hi) < 0:      # bracket upwards: nct is NaN far out, so no fixed wide bracket
        hi *= 1.5
    return float(optimize.brentq(gap, 0.0, hi, xtol=1e-10))


def _lam(df: int, alpha: float, power: float = POWER) -> float:
    """noncentrality_for_power, with df above 64 rounded down to a 5 % geometric grid (planning
    searches visit thousands of df; lambda falls with df, so this errs by < 0.1 % upwards)."""
    if df > 64:
        df = int(64 * 1.05 ** math.floor(math.log(df / 64) / math.log(1.05)))
    return noncentrality_for_power(df, alpha, power)


def mde_pct(se_log: float, df: int, alpha: float, power: float = POWER) -> float:
    """Minimum detectable effect (% increase of ms per token) at this se of the log ratio."""
    return 100.0 * math.expm1(noncentrality_for_power(df, alpha, power) * se_log)


def _smallest_n(ok: Any, start: int) -> int | None:
    """Smallest n >= 2 with ok(n), searched from a normal-approximation start (ok is monotone)."""
    n = max(2, min(start, MAX_SERVERS))
    while n > 2 and ok(n - 1):
        n -= 1
    while not ok(n):
        n += 1
        if n > MAX_SERVERS:
            return None
    return n


def servers_needed(sd_log: float, min_effect_pct: float, alpha: float, power: float = POWER) -> int | None:
    """Servers per arm (balanced) for the two-sided test at alpha to detect min_effect_pct with
    `power`, given the sd of one server's log estimate. None when min_effect_pct is 0."""
    if min_effect_pct <= 0:
        return None
    delta = math.log1p(min_effect_pct / 100)
    z = _tq(1 - alpha / 2, math.inf) + _tq(power, math.inf)
    start = math.ceil(2 * (z * sd_log / delta) ** 2)
    return _smallest_n(lambda n: _lam(2 * n - 2, alpha, power) * sd_log * math.sqrt(2 / n) <= delta, start)


def servers_needed_for_ci(sd_log: float, target_ci_pct: float, alpha: float = 1 - LEVEL) -> int | None:
    """Servers per arm (balanced) for the ratio's (1 - alpha) interval half-width, relative to the
    ratio, to be at most target_ci_pct % (half-width = sinh(t * se_log), se_log = sd * sqrt(2/n))."""
    if target_ci_pct <= 0:
        raise UserError(f"target_ci_pct must be > 0, got {target_ci_pct}")
    h = math.asinh(target_ci_pct / 100)
    start = math.ceil(2 * (_tq(1 - alpha / 2, math.inf) * sd_log / h) ** 2)
    return _smallest_n(lambda n: _tq(1 - alpha / 2, 2 * n - 2) * sd_log * math.sqrt(2 / n) <= h, start)


# -- the comparison ---------------------------------------------------------------------------
@dataclass
class Comparison:
    """An arm against the reference at one depth. decision is None for per-pass rows (no test);
    decide_family fills p_adjusted / p_equiv_adjusted and re-decides."""

    ratio: float | None                 # geometric-mean ratio arm / reference (> 1: arm slower)
    ci: tuple[float, float] | None
    ci_kind: str | None                 # BETWEEN, WITHIN or None
    p: float | None                     # two-sided t, before multiplicity
    p_equiv: float | None               # TOST against +-log(1 + min_effect), before multiplicity
    df: int | None
    se_log: float | None                # standard error of the log ratio
    n_ref: int
    n_arm: int
    mde_pct: float | None
    servers_needed: int | None
    model: str
    decision: str | None
    diff_ms: float | None               # mean arm - mean reference, ms per token
    diff_ci: tuple[float, float] | None
    alpha: float
    min_effect_pct: float
    level: float = LEVEL
    sd_log: float | None = None         # sd of one server's log estimate (floored), for planning
    variance_floored: bool = False
    decision_unadjusted: str | None = None
    p_adjusted: float | None = None
    p_equiv_adjusted: float | None = None
    mde_family_pct: float | None = None  # MDE at the strictest step of the family correction
    correction: str | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def ci_half_width_pct(self) -> float | None:
        """(hi - lo) / 2 as % of the ratio."""
        if self.ci is None or not self.ratio:
            return None
        return 100 * (self.ci[1] - self.ci[0]) / 2 / self.ratio

    def to_dict(self) -> dict[str, Any]:
        lo, hi = self.ci or (None, None)
        dlo, dhi = self.diff_ci or (None, None)
        return {"ratio": self.ratio, "ratio_ci_lo": lo, "ratio_ci_hi": hi, "ci_kind": self.ci_kind,
                "ci_level": self.level, "ci_half_width_pct": self.ci_half_width_pct,
                "p_value": self.p, "p_adjusted": self.p_adjusted, "p_equiv": self.p_equiv,
                "p_equiv_adjusted": self.p_equiv_adjusted, "df": self.df, "se_log": self.se_log,
                "sd_log": self.sd_log, "variance_floored": self.variance_floored,
                "n_ref": self.n_ref, "n_arm": self.n_arm, "mde_pct": self.mde_pct,
                "mde_family_pct": self.mde_family_pct, "servers_needed": self.servers_needed,
                "alpha": self.alpha, "min_effect_pct": self.min_effect_pct, "model": self.model,
                "diff_ms": self.diff_ms, "diff_ci_lo_ms": dlo, "diff_ci_hi_ms": dhi,
                "decision": self.decision, "decision_unadjusted": self.decision_unadjusted,
                "correction": self.correction, "warnings": list(self.warnings)}


def decide(ratio: float | None, p: float | None, p_equiv: float | None, alpha: float,
           min_effect_pct: float) -> str:
    """The rule for ratio = arm / reference: see the module docstring. p None: no test."""
    if ratio is None:
        return NODATA
    if p is not None and p < alpha and abs(ratio - 1) * 100 >= min_effect_pct - 1e-9:
        return SLOWER if ratio > 1 else FASTER
    if min_effect_pct > 0 and p_equiv is not None and p_equiv < alpha:
        return EQUIVALENT
    return INCONCLUSIVE


def _cell_logs(cells: Sequence[CellStats]) -> tuple[np.ndarray, np.ndarray]:
    """(log estimates, within-cell variances of a log estimate, NaN where the cell has no interval)."""
    ok = [(c.estimate, c.log_se) for c in cells if c.estimate is not None and c.estimate > 0]
    x = np.log([e for e, _ in ok]) if ok else np.array([])
    w = np.array([np.nan if s is None else s * s for _, s in ok])
    return x, w


def _nanmean(w: np.ndarray) -> float | None:
    w = w[np.isfinite(w)]
    return float(w.mean()) if w.size else None


def compare_logs(xr: np.ndarray, wr: np.ndarray, xa: np.ndarray, wa: np.ndarray, alpha: float,
                 min_effect_pct: float, level: float = LEVEL) -> Comparison:
    """The pooled comparison on arrays: log estimates per server and their within-cell variances
    (NaN: unknown). pooled_comparison and e2e.changepoints both call this."""
    _check_alpha(alpha)
    if min_effect_pct < 0:
        raise UserError(f"min_effect_pct must be >= 0, got {min_effect_pct}")
    kr, ka = len(xr), len(xa)
    base = dict(alpha=alpha, min_effect_pct=min_effect_pct, level=level, n_ref=kr, n_arm=ka)
    if kr == 0 or ka == 0:
        return Comparison(None, None, None, None, None, None, None, mde_pct=None, servers_needed=None,
                          model="none", decision=NODATA, diff_ms=None, diff_ci=None,
                          warnings=["no cell with an estimate in one of the arms"], **base)
    d = float(xa.mean() - xr.mean())
    ratio = math.exp(d)
    er, ea = np.exp(xr), np.exp(xa)
    diff = float(ea.mean() - er.mean())
    qz = _tq(0.5 + level / 2, math.inf)
    if kr < 2 or ka < 2:
        # within-server only: what the cells' own bootstrap says, never a decision
        vr, va = _nanmean(wr), _nanmean(wa)
        ci = dci = se = None
        if vr is not None and va is not None:
            se = math.sqrt(vr / kr + va / ka)
            ci = (math.exp(d - qz * se), math.exp(d + qz * se))
            lse = math.sqrt(vr * float(np.mean(er ** 2)) / kr + va * float(np.mean(ea ** 2)) / ka)
            dci = (diff - qz * lse, diff + qz * lse)
        return Comparison(ratio, ci, WITHIN if ci else None, None, None, None, se, mde_pct=None,
                          servers_needed=None, decision=INSUFFICIENT_REPLICATION, diff_ms=diff,
                          diff_ci=dci, model="one server in an arm: between-server variance unknown, "
                          "no test; the interval is within-server only",
                          warnings=[f"{min(kr, ka)} server in an arm: at least 2 per arm are needed "
                                    "for a between-server comparison"], **base)
    df = kr + ka - 2
    s2 = ((kr - 1) * float(np.var(xr, ddof=1)) + (ka - 1) * float(np.var(xa, ddof=1))) / df
    w = _nanmean(np.concatenate([wr, wa]))
    floored = w is not None and w > s2
    var = w if floored else s2
    f = 1 / kr + 1 / ka
    se = math.sqrt(var * f)
    # the same model on the linear scale, for the difference in ms (floor by the delta method)
    ls2 = ((kr - 1) * float(np.var(er, ddof=1)) + (ka - 1) * float(np.var(ea, ddof=1))) / df
    lw = _nanmean(np.concatenate([wr * er ** 2, wa * ea ** 2]))
    lse = math.sqrt(max(ls2, lw or 0.0) * f)
    model = (f"pooled two-sample t on log cell estimates (one server = one replicate), common "
             f"between-server variance, df {df}"
             + ("; variance floored by the cells' own bootstrap noise" if floored else ""))
    q = _tq(0.5 + level / 2, df)
    out = Comparison(ratio, None, BETWEEN, None, None, df, se, mde_pct=None, servers_needed=None,
                     model=model, decision=INCONCLUSIVE, diff_ms=diff,
                     diff_ci=(diff - q * lse, diff + q * lse), sd_log=math.sqrt(var),
                     variance_floored=floored, **base)
    if se == 0:
        out.warnings.append("zero variance between the servers and no cell interval: no test")
        return out
    out.ci = (math.exp(d - q * se), math.exp(d + q * se))
    out.p = 2 * _tcdf(-abs(d) / se, df)
    if min_effect_pct > 0:
        m = math.log1p(min_effect_pct / 100)
        out.p_equiv = max(_tcdf(-(d + m) / se, df), _tcdf((d - m) / se, df))
    out.mde_pct = mde_pct(se, df, alpha)
    out.servers_needed = servers_needed(out.sd_log, min_effect_pct, alpha)
    out.decision = decide(ratio, out.p, out.p_equiv, alpha, min_effect_pct)
    return out


def pooled_comparison(ref: Sequence[CellStats], arm: Sequence[CellStats], alpha: float,
                      min_effect_pct: float, level: float = LEVEL) -> Comparison:
    """Arm vs reference at one depth, each cell one server (see the module docstring). The
    decision is before multiplicity: run decide_family over every comparison of the run."""
    xr, wr = _cell_logs(ref)
    xa, wa = _cell_logs(arm)
    return compare_logs(xr, wr, xa, wa, alpha, min_effect_pct, level)


def within_server_ratio(ref: CellStats, arm: CellStats, alpha: float, min_effect_pct: float,
                        level: float = LEVEL, seed: int = SEED) -> Comparison:
    """One pass: the two cells' servers only. Ratio and the percentile interval of the ratio of
    independent bootstrap replicates; no test and no decision (decision None): the interval knows
    nothing of between-server variance."""
    model = "per pass: the two servers only, bootstrap ratio interval (within-server); no decision"
    base = dict(alpha=alpha, min_effect_pct=min_effect_pct, level=level, p=None, p_equiv=None, df=None,
                se_log=None, mde_pct=None, servers_needed=None, model=model, decision=None)
    if ref.estimate is None or arm.estimate is None or ref.estimate <= 0 or arm.estimate <= 0:
        return Comparison(None, None, None, n_ref=0, n_arm=0, diff_ms=None, diff_ci=None,
                          warnings=["no estimate in one of the two cells"], **base)
    ratio, diff = arm.estimate / ref.estimate, arm.estimate - ref.estimate
    if ref.boot.size == 0 or arm.boot.size == 0:
        return Comparison(ratio, None, None, n_ref=1, n_arm=1, diff_ms=diff, diff_ci=None,
                          warnings=["no interval: too few rounds in a cell"], **base)
    rng = np.random.default_rng(seed + 1)
    n = min(ref.boot.size, arm.boot.size)
    rb, ab = rng.choice(ref.boot, n), rng.choice(arm.boot, n)
    keep = rb > 0
    return Comparison(ratio, percentile_ci(ab[keep] / rb[keep], level), WITHIN, n_ref=1, n_arm=1,
                      diff_ms=diff, diff_ci=percentile_ci(ab - rb, level), **base)


# -- the family -------------------------------------------------------------------------------
def adjust(p: Sequence[float], method: str = "holm") -> list[float]:
    """Family-wise adjusted p-values: Holm's step-down, Bonferroni, or none."""
    if method not in METHODS:
        raise UserError(f"unknown multiplicity method {method!r} (one of {', '.join(METHODS)})")
    m = len(p)
    if method == "none" or m == 0:
        return [float(x) for x in p]
    if method == "bonferroni":
        return [min(1.0, m * float(x)) for x in p]
    order = np.argsort(p, kind="stable")
    out, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(p[i])))
        out[int(i)] = running
    return out


def decide_family(comparisons: Sequence[Comparison], alpha: float, method: str = "holm") -> str:
    """Adjust the family's p's (every comparison with a between-server test; the two-sided and the
    equivalence p's separately), re-decide each on the adjusted p's, and return one line saying
    what was done. Comparisons without a test keep their decision; per-pass rows (None) too."""
    _check_alpha(alpha)
    fam = [c for c in comparisons if c.decision is not None and c.p is not None]
    eq = [c for c in fam if c.p_equiv is not None]
    for c, pa in zip(fam, adjust([c.p for c in fam], method)):
        c.p_adjusted = pa
    for c, pe in zip(eq, adjust([c.p_equiv for c in eq], method)):
        c.p_equiv_adjusted = pe
    m = len(fam)
    step_alpha = alpha / m if method != "none" and m else alpha
    name = {"holm": "Holm step-down", "bonferroni": "Bonferroni", "none": "no correction"}[method]
    line = (f"{name} over {m} comparison(s) (arm x depth) at family-wise alpha {alpha:g}, "
            "separately for the difference and the equivalence tests" if m else
            "no comparison with 2 or more servers per arm: nothing to correct")
    for c in fam:
        if c.decision_unadjusted is None:
            c.decision_unadjusted = c.decision
        c.alpha = alpha
        c.decision = decide(c.ratio, c.p_adjusted, c.p_equiv_adjusted, alpha, c.min_effect_pct)
        c.mde_family_pct = mde_pct(c.se_log, c.df, step_alpha) if c.se_log else None
        c.correction = line
        if c.decision == INCONCLUSIVE and c.mde_family_pct is not None:
            need = f"; {c.servers_needed} servers per arm would detect {c.min_effect_pct:g} %" \
                if c.servers_needed else ""
            msg = (f"inconclusive: with {c.n_ref} + {c.n_arm} servers only changes of about "
                   f"{c.mde_family_pct:.1f} % or more are detected with 80 % power{need}")
            c.warnings = [x for x in c.warnings if not x.startswith("inconclusive: with")] + [msg]
    return line


def replication_stop(comparisons: Sequence[Comparison], target_ci_pct: float) -> bool:
    """Adaptive replication: True when every pooled comparison of the family has a between-server
    interval whose half-width is at most target_ci_pct % of the ratio (nothing insufficient)."""
    return replication_stop_rows([c.to_dict() for c in comparisons if c.decision is not None], target_ci_pct)


def replication_stop_rows(pooled: Sequence[dict[str, Any]], target_ci_pct: float) -> bool:
    """replication_stop on pooled comparison rows as a report holds them (Comparison.to_dict)."""
    if not pooled:
        return False
    return all(c["ci_kind"] == BETWEEN and c["ci_half_width_pct"] is not None
               and c["ci_half_width_pct"] <= target_ci_pct for c in pooled)


# -- one arm ----------------------------------------------------------------------------------
def pooled_estimate(cells: Sequence[CellStats], level: float = LEVEL) -> dict[str, Any]:
    """One arm at one depth over its servers: geometric mean and a t interval with k - 1 df on the
    log estimates (variance floored as in pooled_comparison), ci_kind "between-server". One cell:
    that cell's own interval, ci_kind "within-server (one server)"."""
    x, w = _cell_logs(cells)
    k = len(x)
    if k == 0:
        return {"estimate_ms": None, "ci_lo_ms": None, "ci_hi_ms": None, "n_cells": 0, "ci_kind": None}
    if k == 1:
        c = next(c for c in cells if c.estimate is not None and c.estimate > 0)
        lo, hi = c.ci or (None, None)
        return {"estimate_ms": c.estimate, "ci_lo_ms": lo, "ci_hi_ms": hi, "n_cells": 1,
                "ci_kind": WITHIN_ONE if c.ci else None}
    var = max(float(np.var(x, ddof=1)), _nanmean(w) or 0.0)
    m, h = float(x.mean()), _tq(0.5 + level / 2, k - 1) * math.sqrt(var / k)
    return {"estimate_ms": math.exp(m), "ci_lo_ms": math.exp(m - h), "ci_hi_ms": math.exp(m + h),
            "n_cells": k, "ci_kind": BETWEEN}
