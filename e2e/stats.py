"""Intervals, tests and decisions for decode ms per token. Pure: numbers in, numbers out, no I/O.

What the answers mean (README.md, "Statistics", says it at length):

* A cell is one server at one depth. Its estimate is e2e.estimate's differenced medians,
  (median T_long - median T_short) / (long - short) in ms per token.
* Cell interval: a 95 % percentile bootstrap over ROUNDS (each round holds one long and one short
  request sent back to back; resampling whole rounds keeps that pairing, so slow drift within a
  cell does not widen the interval). A difference of two medians has no distribution-free
  order-statistic interval, hence the bootstrap. Fixed seed: the same rows give the same interval.
  Fewer than MIN_ROUNDS_FOR_CI usable rounds: no interval (None) and a warning.
* Between arms the replication unit is the server (the cell), not the request: across server
  starts the same setup moved by up to 16 % on the CPU lane and 25 % on the H200, far more than the
  spread within one server. The pooled comparison therefore works on the per-cell estimates (one
  per pass) in log space; see pooled_ratio for the test and its fallbacks.
* A decision is "slower" / "faster" only when the difference is significant (p < alpha AND the
  interval of the ratio excludes 1) AND the point ratio is at least min_effect_pct away from 1
  (asv's rule: significance alone is not a change). Otherwise "no significant difference", or
  "insufficient data" when there is nothing to compare.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np
from scipy import stats as st

from e2e.estimate import differenced_ms

SCHEMA_VERSION = 1        # of every result file written from these statistics
LEVEL = 0.95              # confidence level of every interval
MIN_ROUNDS_FOR_CI = 5     # fewer usable rounds: no cell interval (a bootstrap of 4 medians is noise)
MIN_VALID_ROWS = 3        # per output length; fewer: "too few valid rows"
N_BOOT = 2000
SEED = 20261129           # fixed: intervals are reproducible from the rows
CV_WARN = 0.10            # per-round spread >= 10 % of the estimate (pyperf's std >= 10 % of mean)
OUTLIER_Z = 3.5           # robust z (0.6745 * |x - median| / MAD) beyond which a round is an outlier
DISAGREE_WARN = 0.10      # client and server decode per token more than 10 % apart
WIDE_CI_WARN = 0.10       # cell interval half-width more than 10 % of the estimate

SLOWER, FASTER, SAME, NODATA = "slower", "faster", "no significant difference", "insufficient data"


# -- per cell ---------------------------------------------------------------------------------
def round_values(rows: Iterable[dict[str, Any]], n_long: int, n_short: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Client times (s) per round: arrays (long, short) indexed by round, NaN where the round has no
    valid row of that length. Rows without a 'round' key are paired in order of arrival."""
    by_round: dict[int, dict[int, float]] = {}
    counts = {n_long: 0, n_short: 0}
    for r in rows:
        n = r.get("n_tokens")
        if n not in counts:
            continue
        rnd = r.get("round")
        if rnd is None:
            rnd = counts[n]
        counts[n] += 1
        if r.get("valid") and r.get("t_client_s") is not None:
            by_round.setdefault(int(rnd), {})[n] = float(r["t_client_s"])
    keys = sorted(by_round)
    long_ = np.array([by_round[k].get(n_long, np.nan) for k in keys], dtype=float)
    short = np.array([by_round[k].get(n_short, np.nan) for k in keys], dtype=float)
    return long_, short


def bootstrap_estimates(long_s: np.ndarray, short_s: np.ndarray, n_long: int, n_short: int,
                        n_boot: int = N_BOOT, seed: int = SEED) -> np.ndarray:
    """Bootstrap replicates of the differenced estimate (ms/token), resampling whole rounds.
    Replicates whose resample holds no valid long or no valid short row are dropped."""
    k = len(long_s)
    if k == 0:
        return np.array([])
    idx = np.random.default_rng(seed).integers(0, k, size=(n_boot, k))
    with np.errstate(all="ignore"), _quiet_nan():
        ml = np.nanmedian(long_s[idx], axis=1)
        ms = np.nanmedian(short_s[idx], axis=1)
    b = (ml - ms) / (n_long - n_short) * 1e3
    return b[np.isfinite(b)]


class _quiet_nan:
    """np.nanmedian warns on all-NaN rows; those replicates are dropped anyway."""

    def __enter__(self) -> None:
        import warnings
        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc: object) -> None:
        self._w.__exit__(*exc)


def percentile_ci(samples: np.ndarray, level: float = LEVEL) -> tuple[float, float] | None:
    if samples.size == 0:
        return None
    a = (1 - level) / 2
    lo, hi = np.quantile(samples, [a, 1 - a])
    return float(lo), float(hi)


def robust_outliers(x: np.ndarray, z: float = OUTLIER_Z) -> np.ndarray:
    """Indices whose modified z-score (Iglewicz-Hoaglin) exceeds z. Fewer than 5 values, or MAD 0
    (most values equal): none are called outliers, since the scale is unknown."""
    x = np.asarray(x, dtype=float)
    if x.size < 5:  # with 3-4 values the MAD is too unstable to call anything an outlier
        return np.array([], dtype=int)
    med = np.median(x)
    mad = np.median(np.abs(x - med))
    if mad == 0:
        return np.array([], dtype=int)
    return np.flatnonzero(0.6745 * np.abs(x - med) / mad > z)


@dataclass
class CellStats:
    """One cell's figures. `boot` (bootstrap replicates) is kept for between-arm intervals and is
    not serialised."""

    estimate: float | None
    ci: tuple[float, float] | None
    n_rounds: int                 # rounds with both a valid long and a valid short row
    n_valid_long: int
    n_valid_short: int
    n_invalid: int
    cv: float | None              # std / mean of the per-round differenced values
    per_round: list[float]
    outlier_rounds: list[int]
    server_estimate: float | None
    disagreement: float | None    # (client - server) / server
    warnings: list[str] = field(default_factory=list)
    boot: np.ndarray = field(default_factory=lambda: np.array([]), repr=False)

    @property
    def half_width_rel(self) -> float | None:
        """Interval half-width as a fraction of the estimate."""
        if self.ci is None or not self.estimate:
            return None
        return (self.ci[1] - self.ci[0]) / 2 / abs(self.estimate)

    @property
    def log_se(self) -> float | None:
        """Standard error of log(estimate) from the bootstrap (what pooled_ratio floors with)."""
        if self.ci is None:
            return None
        b = self.boot[self.boot > 0]
        return float(np.std(np.log(b), ddof=1)) if b.size > 1 else None

    def to_dict(self) -> dict[str, Any]:
        return {"estimate_ms": self.estimate,
                "ci_lo_ms": self.ci[0] if self.ci else None, "ci_hi_ms": self.ci[1] if self.ci else None,
                "half_width_pct": _pct(self.half_width_rel), "n_rounds": self.n_rounds,
                "n_valid_long": self.n_valid_long, "n_valid_short": self.n_valid_short,
                "n_invalid": self.n_invalid, "cv_pct": _pct(self.cv), "per_round_ms": self.per_round,
                "outlier_rounds": self.outlier_rounds, "server_estimate_ms": self.server_estimate,
                "server_disagreement_pct": _pct(self.disagreement), "warnings": list(self.warnings)}


def _pct(x: float | None) -> float | None:
    return None if x is None else 100.0 * x


def cell_stats(rows: Sequence[dict[str, Any]], n_long: int, n_short: int, level: float = LEVEL,
               seed: int = SEED) -> CellStats:
    """Estimate, interval, spread and warnings of one cell from its timed rows (measure.py rows).

    Warnings: too few valid rows (< MIN_VALID_ROWS of a length), no interval (< MIN_ROUNDS_FOR_CI
    usable rounds), invalid rows, spread (CV >= CV_WARN), outlier rounds (robust z > OUTLIER_Z),
    wide interval (half-width > WIDE_CI_WARN), client/server disagreement (> DISAGREE_WARN)."""
    long_s, short_s = round_values(rows, n_long, n_short)
    vl, vs = long_s[np.isfinite(long_s)], short_s[np.isfinite(short_s)]
    est = differenced_ms(vl.tolist(), vs.tolist(), n_long, n_short)
    both = np.isfinite(long_s) & np.isfinite(short_s)
    per_round = (long_s[both] - short_s[both]) / (n_long - n_short) * 1e3
    n_invalid = sum(1 for r in rows if not r.get("valid"))
    warnings: list[str] = []
    if vl.size < MIN_VALID_ROWS or vs.size < MIN_VALID_ROWS:
        warnings.append(f"too few valid rows ({vl.size} long, {vs.size} short; want >= {MIN_VALID_ROWS})")
    if n_invalid:
        warnings.append(f"{n_invalid} invalid row(s) left out")
    boot = np.array([])
    ci = None
    if est is not None and int(both.sum()) >= MIN_ROUNDS_FOR_CI:
        boot = bootstrap_estimates(long_s, short_s, n_long, n_short, seed=seed)
        ci = percentile_ci(boot, level)
    elif est is not None:
        warnings.append(f"no interval: {int(both.sum())} usable round(s), need {MIN_ROUNDS_FOR_CI}")
    cv = None
    if per_round.size >= 2 and np.mean(per_round) != 0:
        cv = float(np.std(per_round, ddof=1) / abs(np.mean(per_round)))
        if cv >= CV_WARN:
            warnings.append(f"spread too wide: per-round CV {100 * cv:.1f} % (>= {100 * CV_WARN:.0f} %)")
    out = robust_outliers(per_round)
    rounds_used = np.flatnonzero(both)
    outlier_rounds = [int(rounds_used[i]) for i in out]
    if outlier_rounds:
        warnings.append(f"outlier round(s) {outlier_rounds} (robust z > {OUTLIER_Z})")
    cs = CellStats(est, ci, int(both.sum()), int(vl.size), int(vs.size), n_invalid, cv,
                   [float(x) for x in per_round], outlier_rounds, None, None, warnings, boot)
    hw = cs.half_width_rel
    if hw is not None and hw > WIDE_CI_WARN:
        warnings.append(f"imprecise: interval half-width {100 * hw:.1f} % of the estimate")
    srv_l = [r["server_decode_s"] for r in rows if r.get("valid") and r.get("n_tokens") == n_long
             and r.get("server_decode_s") is not None]
    srv_s = [r["server_decode_s"] for r in rows if r.get("valid") and r.get("n_tokens") == n_short
             and r.get("server_decode_s") is not None]
    cs.server_estimate = differenced_ms(srv_l, srv_s, n_long, n_short)
    if est is not None and cs.server_estimate:
        cs.disagreement = (est - cs.server_estimate) / cs.server_estimate
        if abs(cs.disagreement) > DISAGREE_WARN:
            warnings.append(f"client and server decode disagree by {100 * cs.disagreement:+.1f} %")
    return cs


def target_ci_stop_rule(cfg: Any) -> Callable[[list[dict[str, Any]]], bool] | None:
    """The adaptive-precision rule for measure.py, or None when cfg.workload.target_ci_pct is None.

    The returned function gets the cell's timed rows so far and answers True when the cell's
    bootstrap interval half-width is below target_ci_pct % of the estimate. With fewer than
    MIN_ROUNDS_FOR_CI usable rounds there is no interval, so it answers False (keep measuring;
    measure.py stops at max_rounds regardless)."""
    pct = cfg.workload.target_ci_pct
    if pct is None:
        return None
    n_long, n_short = cfg.workload.long_tokens, cfg.workload.short_tokens

    def stop(rows: list[dict[str, Any]]) -> bool:
        hw = cell_stats(rows, n_long, n_short).half_width_rel
        return hw is not None and hw * 100 < pct

    return stop


# -- between arms -----------------------------------------------------------------------------
def decide(ratio: float | None, ci: tuple[float, float] | None, p: float | None,
           alpha: float, min_effect_pct: float) -> str:
    """asv-style decision for ratio = arm / reference (ms per token: > 1 means the arm is slower).

    Significant: the interval excludes 1 AND p < alpha; p None means the test could not reach
    alpha with so few values, and the interval alone decides (asv's fallback).
    A change: significant AND |ratio - 1| >= min_effect_pct / 100. No ratio or no interval:
    "insufficient data"."""
    if ratio is None or ci is None:
        return NODATA
    significant = (p is None or p < alpha) and (ci[0] > 1 or ci[1] < 1)
    if not significant or abs(ratio - 1) * 100 < min_effect_pct:
        return SAME
    return SLOWER if ratio > 1 else FASTER


def mann_whitney_p(a: Sequence[float], b: Sequence[float], alpha: float) -> float | None:
    """Two-sided Mann-Whitney U p-value (scipy, exact for small samples), or None when even total
    separation of the samples could not give p < alpha (too few values: the caller falls back to
    the interval check, as asv does)."""
    na, nb = len(a), len(b)
    if na == 0 or nb == 0:
        return None
    if 2.0 / math.comb(na + nb, na) >= alpha:  # smallest attainable exact two-sided p
        return None
    return float(st.mannwhitneyu(a, b, alternative="two-sided").pvalue)


@dataclass
class Comparison:
    """An arm against the reference at one depth (per pass, or pooled over passes)."""

    ratio: float | None
    ci: tuple[float, float] | None
    p: float | None
    test: str
    diff_ms: float | None          # arm - reference, ms per token
    diff_ci: tuple[float, float] | None
    decision: str
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"ratio": self.ratio, "ratio_ci_lo": self.ci[0] if self.ci else None,
                "ratio_ci_hi": self.ci[1] if self.ci else None, "p_value": self.p, "test": self.test,
                "diff_ms": self.diff_ms, "diff_ci_lo_ms": self.diff_ci[0] if self.diff_ci else None,
                "diff_ci_hi_ms": self.diff_ci[1] if self.diff_ci else None,
                "decision": self.decision, "warnings": list(self.warnings)}


def _nodata(why: str) -> Comparison:
    return Comparison(None, None, None, "none", None, None, NODATA, [why])


def within_server_ratio(ref: CellStats, arm: CellStats, alpha: float, min_effect_pct: float,
                        level: float = LEVEL, seed: int = SEED) -> Comparison:
    """One pass: the two cells' servers only. Interval: percentile of the ratio of independent
    bootstrap replicates; test: Mann-Whitney on the per-round differenced values. When the test
    cannot reach alpha (few rounds) the interval alone decides. This interval knows nothing of
    between-server variance: say so wherever it is shown."""
    if ref.estimate is None or arm.estimate is None or ref.estimate <= 0:
        return _nodata("no estimate in one of the two cells")
    ratio = arm.estimate / ref.estimate
    diff = arm.estimate - ref.estimate
    if ref.boot.size == 0 or arm.boot.size == 0:
        return Comparison(ratio, None, None, "none", diff, None, NODATA,
                          ["no interval: too few rounds in a cell"])
    rng = np.random.default_rng(seed + 1)
    n = min(ref.boot.size, arm.boot.size)
    rb, ab = rng.choice(ref.boot, n), rng.choice(arm.boot, n)
    keep = rb > 0
    ci = percentile_ci(ab[keep] / rb[keep], level)
    dci = percentile_ci(ab - rb, level)
    p = mann_whitney_p(ref.per_round, arm.per_round, alpha)
    test = "mann-whitney (rounds)" if p is not None else "interval only (too few rounds for the test)"
    return Comparison(ratio, ci, p, test, diff, dci, decide(ratio, ci, p, alpha, min_effect_pct))


def pooled_ratio(ref: Sequence[CellStats], arm: Sequence[CellStats], alpha: float,
                 min_effect_pct: float, level: float = LEVEL) -> Comparison:
    """All passes: each cell (server) is one replicate.

    Ratio = exp(mean log arm estimates - mean log reference estimates) (a geometric mean ratio).
    Each arm's variance of a log estimate is max(sample variance across its cells, mean squared
    within-cell bootstrap SE): a pessimistic floor, since two servers that happen to agree must not
    make the interval narrower than either server's own noise. Test: Welch's t on the log estimates
    (equals scipy.stats.ttest_ind(equal_var=False) when the floor does not bind), Welch-
    Satterthwaite df. With ONE cell in an arm the between-server variance is unknown: the within-
    cell variance is used with a normal quantile, and a warning says the interval is too narrow
    for a between-server claim. Difference in ms/token: mean arm - mean reference, same variances
    on the linear scale."""
    r = [c for c in ref if c.estimate is not None and c.estimate > 0]
    a = [c for c in arm if c.estimate is not None and c.estimate > 0]
    if not r or not a:
        return _nodata("no cell with an estimate in one of the arms")
    warnings: list[str] = []
    ratio = math.exp(float(np.mean(np.log([c.estimate for c in a]))) - float(np.mean(np.log([c.estimate for c in r]))))
    parts = []
    for cells in (r, a):
        m_log, var, k, w_var = _arm_log_var(cells)
        if var is None:
            return Comparison(ratio, None, None, "none", None, None, NODATA,
                              ["one cell per arm and no cell interval: no between-arm interval"])
        # linear-scale variance for the ms difference, same floor (delta method: var_lin ~ m^2 var_log)
        lin = np.array([c.estimate for c in cells])
        m_lin = float(np.mean(lin))
        lin_var = max(float(np.var(lin, ddof=1)) if k >= 2 else 0.0, (w_var or 0.0) * m_lin ** 2)
        parts.append((m_log, var, k, m_lin, lin_var))
    (mr, vr, kr, lr, lvr), (ma, va, ka, la, lva) = parts
    se2r, se2a = vr / kr, va / ka
    se = math.sqrt(se2r + se2a)
    if kr >= 2 and ka >= 2:
        df = (se2r + se2a) ** 2 / (se2r ** 2 / (kr - 1) + se2a ** 2 / (ka - 1)) if se > 0 else float("inf")
        test = f"welch t on log cell estimates (df {df:.1f})"
    else:
        df = float("inf")
        test = "normal, within-server variance only (one cell in an arm)"
        warnings.append("one server in an arm: the interval leaves out between-server variance")
    q = float(st.t.ppf(0.5 + level / 2, df)) if math.isfinite(df) else float(st.norm.ppf(0.5 + level / 2))
    d = ma - mr
    if se == 0:
        p = 0.0 if d != 0 else 1.0
        ci = (math.exp(d), math.exp(d))
    else:
        tstat = d / se
        p = float(2 * (st.t.sf(abs(tstat), df) if math.isfinite(df) else st.norm.sf(abs(tstat))))
        ci = (math.exp(d - q * se), math.exp(d + q * se))
    lse = math.sqrt(lvr / kr + lva / ka)
    diff = la - lr
    return Comparison(ratio, ci, p, test, diff, (diff - q * lse, diff + q * lse),
                      decide(ratio, ci, p, alpha, min_effect_pct), warnings)


def _arm_log_var(cells: Sequence[CellStats]) -> tuple[float, float | None, int, float | None]:
    """(mean log estimate, variance of one cell's log estimate, number of cells, mean within-cell
    bootstrap variance). The variance is pooled_ratio's floor: max(between-cell sample variance,
    mean within-cell variance); None when neither exists (one cell without an interval)."""
    logs = np.log([c.estimate for c in cells])
    within = [c.log_se for c in cells if c.log_se is not None]
    w_var = float(np.mean(np.square(within))) if within else None
    cands = [v for v in (float(np.var(logs, ddof=1)) if len(cells) >= 2 else None, w_var) if v is not None]
    return float(np.mean(logs)), (max(cands) if cands else None), len(cells), w_var


def pooled_estimate(cells: Sequence[CellStats], level: float = LEVEL) -> dict[str, Any]:
    """One arm at one depth over its cells (servers): geometric mean estimate and its interval
    (t with k-1 df on the log estimates, variance floored as in pooled_ratio; one cell: that cell's
    own interval). Used by history."""
    c = [x for x in cells if x.estimate is not None and x.estimate > 0]
    if not c:
        return {"estimate_ms": None, "ci_lo_ms": None, "ci_hi_ms": None, "n_cells": 0}
    if len(c) == 1:
        ci = c[0].ci
        return {"estimate_ms": c[0].estimate, "ci_lo_ms": ci[0] if ci else None,
                "ci_hi_ms": ci[1] if ci else None, "n_cells": 1}
    m, var, k, _ = _arm_log_var(c)
    q = float(st.t.ppf(0.5 + level / 2, k - 1))
    se = math.sqrt(var / k)
    return {"estimate_ms": math.exp(m), "ci_lo_ms": math.exp(m - q * se), "ci_hi_ms": math.exp(m + q * se),
            "n_cells": k}


def pass_agreement(per_pass: dict[int, CellStats]) -> dict[str, Any]:
    """Same arm, same depth across passes: the largest relative difference (max - min) / min of the
    estimates, and whether it exceeds what the two cells' intervals allow (the difference is larger
    than sqrt(hw_max^2 + hw_min^2), the half-width of their difference). One pass: nothing to say."""
    cells = {p: c for p, c in per_pass.items() if c.estimate is not None}
    if len(cells) < 2:
        return {"n_passes": len(cells), "max_rel_diff_pct": None, "flagged": False, "passes": None}
    lo_p = min(cells, key=lambda p: cells[p].estimate)
    hi_p = max(cells, key=lambda p: cells[p].estimate)
    lo, hi = cells[lo_p], cells[hi_p]
    rel = (hi.estimate - lo.estimate) / lo.estimate
    flagged = False
    allowed = None
    if lo.ci is not None and hi.ci is not None:
        allowed = math.hypot((lo.ci[1] - lo.ci[0]) / 2, (hi.ci[1] - hi.ci[0]) / 2)
        flagged = hi.estimate - lo.estimate > allowed
    return {"n_passes": len(cells), "max_rel_diff_pct": 100 * rel, "flagged": flagged,
            "allowed_ms": allowed, "passes": [lo_p, hi_p]}

