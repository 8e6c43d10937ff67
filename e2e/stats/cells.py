"""Per-cell statistics of decode ms per token. Pure: numbers in, numbers out, no I/O.

What the answers mean (docs/statistics/index.md says it at length):

* A cell is one server at one depth. Its estimate is e2e.stats.estimate's differenced medians,
  (median Y_long - median Y_short) / (long - short) in ms per token, Y under the run's estimator
  (e2e.stats.estimate: the client's wall time, or that minus the server's own prefill time). The plain
  client estimate is kept beside it as the check (`client_estimate`, `client_agrees`).
* Cell interval: a 95 % percentile bootstrap over ROUNDS (each round holds one long and one short
  request sent back to back; resampling whole rounds keeps that pairing, so slow drift within a
  cell does not widen the interval). A difference of two medians has no distribution-free
  order-statistic interval, hence the bootstrap. Fixed seed: the same rows give the same interval.
  Fewer than MIN_ROUNDS_FOR_CI usable rounds: no interval (None) and a warning.
* The cell's noise for the between-server model is NOT the bootstrap's (one +0.5 s request makes
  a 6-round bootstrap 10-50x wider): it is a robust one, the MAD of each length's values scaled to
  the variance of a median (median_variance_factor), with its effective degrees of freedom.
* Between arms the replication unit is the server, not the request: e2e/stats/variance_model.py fits
  the servers' log estimates, e2e/stats/verdicts.py decides; e2e/stats/changepoints.py finds steps in a
  series of runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any

import numpy as np

from e2e.rundir.rows import Row
from e2e.stats.bootstrap import bootstrap_estimates, paired_bootstrap, percentile_ci
from e2e.stats.estimate import CLIENT, differenced_ms, request_value

SCHEMA_VERSION = 1  # of every result file written from these statistics
LEVEL = 0.95  # confidence level of every interval
MIN_ROUNDS_FOR_CI = 5  # fewer usable rounds: no cell interval (a bootstrap of 4 medians is noise)
MIN_VALID_ROWS = 3  # per output length; fewer: "too few valid rows"
SEED = 20261129  # fixed: intervals are reproducible from the rows
CV_WARN = 0.10  # per-round spread >= 10 % of the estimate (pyperf's std >= 10 % of mean)
OUTLIER_Z = 3.5  # robust z (0.6745 * |x - median| / MAD) beyond which a round is an outlier
DISAGREE_WARN = 0.10  # client and server decode per token more than 10 % apart
WIDE_CI_WARN = 0.10  # cell interval half-width more than 10 % of the estimate
# The estimator's check: the corrected and the plain client estimate of one cell estimate the same
# thing; they disagree when they differ by more than AGREE_PCT % AND by more than AGREE_SD paired
# bootstrap sds of their difference (the plain one's own noise, +-1.3-2.1 % at 32K on the H200).
AGREE_PCT, AGREE_SD = 1.0, 3.0
MAD_TO_SD = 1.482602218505602  # 1 / Phi^-1(3/4): the MAD of a normal sample estimates 0.6745 sd


@lru_cache(maxsize=512)
def median_variance_factor(n: int) -> tuple[float, float]:
    """(k, df) for n values: k * (MAD_TO_SD * MAD)^2 estimates the variance of their median, and
    that estimate has about df degrees of freedom (2 / CV^2 of it). By simulation of normal samples
    (fixed seed, 200,000 samples; asymptotics beyond 200: pi / 2n and 0.3676 n). For heavy-tailed
    rounds it errs on the safe side (t3: 2.02 / n against the median's true 1.85 / n)."""
    if n == 1:  # one value is its own median: its variance is the per-value variance, and it says nothing of it
        return 1.0, 0.0
    if n < 1:
        return math.nan, 0.0
    if n > 200:
        return math.pi / (2 * n), 0.3676 * n
    rng = np.random.default_rng([SEED, n])
    med, s2 = [], []
    for _ in range(10):  # 200,000 samples in chunks: ~0.5 % Monte-Carlo error
        x = rng.standard_normal((20_000, n))
        m = np.median(x, axis=1)
        med.append(m)
        s2.append((MAD_TO_SD * np.median(np.abs(x - m[:, None]), axis=1)) ** 2)
    m, v = np.concatenate(med), np.concatenate(s2)
    k = float(m.var() / v.mean())
    cv2 = float(v.var() / v.mean() ** 2)
    return k, 2.0 / cv2


def robust_scale(x: np.ndarray) -> float | None:
    """MAD_TO_SD * MAD of finite values (a normal sample's sd), None with fewer than 2."""
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    if x.size < 2:
        return None
    return float(MAD_TO_SD * np.median(np.abs(x - np.median(x))))


# -- per cell ---------------------------------------------------------------------------------
def round_values(
    rows: Iterable[Row], n_long: int, n_short: int, estimator: str = CLIENT
) -> tuple[np.ndarray, np.ndarray]:
    """Y (s) per round under `estimator`: arrays (long, short) indexed by round, NaN where the round
    has no valid row of that length (or no Y). Every round with a valid row is kept, so the arrays of
    two estimators align round by round. Rows without a 'round' key pair in order of arrival."""
    value = request_value(estimator)
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
        if not r.get("valid"):
            continue
        y = value(r)  # None: the row lacks the estimator's value (a missing prefill time): NaN, the round stays
        rv = by_round.setdefault(int(rnd), {})
        if y is not None:
            rv[n] = float(y)
    keys = sorted(by_round)
    long_ = np.array([by_round[k].get(n_long, np.nan) for k in keys], dtype=float)
    short = np.array([by_round[k].get(n_short, np.nan) for k in keys], dtype=float)
    return long_, short


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
class Noise:
    """A cell's robust noise: per output length the number of values and their robust sd (s)."""

    n_long: int
    n_short: int
    scale_long: float | None
    scale_short: float | None

    def var_of_difference(self, scale_long: float | None = None, scale_short: float | None = None) -> float | None:
        """Variance (s^2) of median Y_long - median Y_short, by the MAD scales given (default: the
        cell's own); None when a scale is unknown."""
        sl = self.scale_long if scale_long is None else scale_long
        ss = self.scale_short if scale_short is None else scale_short
        if sl is None or ss is None or self.n_long < 2 or self.n_short < 2:
            return None
        return median_variance_factor(self.n_long)[0] * sl**2 + median_variance_factor(self.n_short)[0] * ss**2


@dataclass
class CellStats:
    """One cell's figures. `boot` (bootstrap replicates) is kept for within-server intervals and is
    not serialised."""

    estimate: float | None
    ci: tuple[float, float] | None
    n_rounds: int  # rounds with both a valid long and a valid short row
    n_valid_long: int
    n_valid_short: int
    n_invalid: int
    cv: float | None  # std / mean of the per-round differenced values
    per_round: list[float]
    outlier_rounds: list[int]
    server_estimate: float | None
    disagreement: float | None  # (client - server) / server
    warnings: list[str] = field(default_factory=list)
    boot: np.ndarray = field(default_factory=lambda: np.array([]), repr=False)
    estimator: str = CLIENT
    noise: Noise | None = None
    n_long: int = 64  # the two output lengths (the robust noise is per length)
    n_short: int = 8
    client_estimate: float | None = None  # the plain client estimate, the seed's check
    client_gap: float | None = None  # (client - estimate) / estimate
    client_gap_sd: float | None = None  # paired bootstrap sd of that, relative
    client_agrees: bool | None = None  # None: nothing to check (estimator "client" or no data)

    @property
    def half_width_rel(self) -> float | None:
        """Interval half-width as a fraction of the estimate."""
        if self.ci is None or not self.estimate:
            return None
        return (self.ci[1] - self.ci[0]) / 2 / abs(self.estimate)

    @cached_property
    def log_se(self) -> float | None:
        """Standard error of log(estimate) from the bootstrap. Computed once: a cell's bootstrap is
        not changed once built. Shown, never used as a variance floor (robust_log_var is)."""
        if self.ci is None:
            return None
        b = self.boot[self.boot > 0]
        return float(np.std(np.log(b), ddof=1)) if b.size > 1 else None

    @property
    def robust_log_var(self) -> float | None:
        """The cell's own robust variance of log(estimate): the MAD-scaled variance of the two
        medians' difference over the difference squared (delta method)."""
        if self.noise is None or not self.estimate or self.estimate <= 0:
            return None
        v = self.noise.var_of_difference()
        d = self.estimate * (self.n_long - self.n_short) / 1e3
        return None if v is None else v / d**2

    def to_dict(self) -> dict[str, Any]:
        rv = self.robust_log_var
        return {
            "estimate_ms": self.estimate,
            "estimator": self.estimator,
            "ci_lo_ms": self.ci[0] if self.ci else None,
            "ci_hi_ms": self.ci[1] if self.ci else None,
            "half_width_pct": _pct(self.half_width_rel),
            "n_rounds": self.n_rounds,
            "n_valid_long": self.n_valid_long,
            "n_valid_short": self.n_valid_short,
            "n_invalid": self.n_invalid,
            "cv_pct": _pct(self.cv),
            "per_round_ms": self.per_round,
            "outlier_rounds": self.outlier_rounds,
            "robust_se_pct": None if rv is None else 100 * math.sqrt(rv),
            "client_estimate_ms": self.client_estimate,
            "client_gap_pct": _pct(self.client_gap),
            "client_agrees": self.client_agrees,
            "server_estimate_ms": self.server_estimate,
            "server_disagreement_pct": _pct(self.disagreement),
            "warnings": list(self.warnings),
        }


def _pct(x: float | None) -> float | None:
    return None if x is None else 100.0 * x


def cell_stats(
    rows: Sequence[Row], n_long: int, n_short: int, level: float = LEVEL, seed: int = SEED, estimator: str = CLIENT
) -> CellStats:
    """Estimate, interval, spread, robust noise and warnings of one cell from its timed rows
    (measure.py rows), under `estimator` (e2e.stats.estimate).

    Warnings: too few valid rows (< MIN_VALID_ROWS of a length), no interval (< MIN_ROUNDS_FOR_CI
    usable rounds), invalid rows, spread (CV >= CV_WARN), outlier rounds (robust z > OUTLIER_Z),
    wide interval (half-width > WIDE_CI_WARN), client/server disagreement (> DISAGREE_WARN), and
    for a corrected estimate its disagreement with the plain client one (AGREE_PCT, AGREE_SD)."""
    long_s, short_s = round_values(rows, n_long, n_short, estimator)
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
    boot, ci = _interval(est, long_s, short_s, n_long, n_short, level, seed, warnings)
    cv = _spread(per_round, warnings)
    out = robust_outliers(per_round)
    rounds_used = np.flatnonzero(both)
    outlier_rounds = [int(rounds_used[i]) for i in out]
    if outlier_rounds:
        warnings.append(f"outlier round(s) {outlier_rounds} (robust z > {OUTLIER_Z})")
    noise = Noise(int(vl.size), int(vs.size), robust_scale(vl), robust_scale(vs))
    cs = CellStats(
        est,
        ci,
        int(both.sum()),
        int(vl.size),
        int(vs.size),
        n_invalid,
        cv,
        [float(x) for x in per_round],
        outlier_rounds,
        None,
        None,
        warnings,
        boot,
        estimator=estimator,
        noise=noise,
        n_long=n_long,
        n_short=n_short,
    )
    hw = cs.half_width_rel
    if hw is not None and hw > WIDE_CI_WARN:
        warnings.append(f"imprecise: interval half-width {100 * hw:.1f} % of the estimate")
    _check_against_server(cs, rows)
    _check_against_client(cs, rows, long_s, short_s, seed)
    return cs


def _interval(
    est: float | None,
    long_s: np.ndarray,
    short_s: np.ndarray,
    n_long: int,
    n_short: int,
    level: float,
    seed: int,
    warnings: list[str],
) -> tuple[np.ndarray, tuple[float, float] | None]:
    """The bootstrap replicates and percentile interval, where there are enough paired rounds for
    one; else none, and a warning saying so (when there is an estimate to want one for)."""
    usable = int((np.isfinite(long_s) & np.isfinite(short_s)).sum())
    if est is not None and usable >= MIN_ROUNDS_FOR_CI:
        boot = bootstrap_estimates(long_s, short_s, n_long, n_short, seed=seed)
        return boot, percentile_ci(boot, level)
    if est is not None:
        warnings.append(f"no interval: {usable} usable round(s), need {MIN_ROUNDS_FOR_CI}")
    return np.array([]), None


def _spread(per_round: np.ndarray, warnings: list[str]) -> float | None:
    """The per-round CV (None under two rounds or a zero mean), with a warning at CV_WARN and over."""
    if per_round.size < 2 or np.mean(per_round) == 0:
        return None
    cv = float(np.std(per_round, ddof=1) / abs(np.mean(per_round)))
    if cv >= CV_WARN:
        warnings.append(f"spread too wide: per-round CV {100 * cv:.1f} % (>= {100 * CV_WARN:.0f} %)")
    return cv


def _check_against_server(cs: CellStats, rows: Sequence[Row]) -> None:
    """The server's own decode time differenced the same way, and whether the estimate is far from it."""

    def decode_s(n: int) -> list[float]:
        return [
            r["server_decode_s"]
            for r in rows
            if r.get("valid") and r.get("n_tokens") == n and r.get("server_decode_s") is not None
        ]

    cs.server_estimate = differenced_ms(decode_s(cs.n_long), decode_s(cs.n_short), cs.n_long, cs.n_short)
    if cs.estimate is not None and cs.server_estimate:
        cs.disagreement = (cs.estimate - cs.server_estimate) / cs.server_estimate
        if abs(cs.disagreement) > DISAGREE_WARN:
            cs.warnings.append(f"client and server decode disagree by {100 * cs.disagreement:+.1f} %")


def _check_against_client(
    cs: CellStats, rows: Sequence[Row], long_s: np.ndarray, short_s: np.ndarray, seed: int
) -> None:
    """The plain client estimate beside a corrected one, and whether the two agree: the paired
    bootstrap (the same resampled rounds for both) gives the sd of their difference."""
    cl, cs_ = round_values(rows, cs.n_long, cs.n_short, CLIENT)
    vl, vs = cl[np.isfinite(cl)], cs_[np.isfinite(cs_)]
    cs.client_estimate = differenced_ms(vl.tolist(), vs.tolist(), cs.n_long, cs.n_short)
    if cs.estimator == CLIENT or cs.estimate is None or cs.client_estimate is None or cs.estimate <= 0:
        return
    cs.client_gap = (cs.client_estimate - cs.estimate) / cs.estimate
    same = np.isfinite(cl) & np.isfinite(cs_) & np.isfinite(long_s) & np.isfinite(short_s)
    if same.sum() >= MIN_ROUNDS_FOR_CI:
        bc = paired_bootstrap(cl[same], cs_[same], cs.n_long, cs.n_short, seed)
        be = paired_bootstrap(long_s[same], short_s[same], cs.n_long, cs.n_short, seed)
        cs.client_gap_sd = float(np.std(bc - be, ddof=1)) / cs.estimate
    tol = max(AGREE_PCT / 100, AGREE_SD * (cs.client_gap_sd or 0.0))
    cs.client_agrees = abs(cs.client_gap) <= tol
    if not cs.client_agrees:
        cs.warnings.append(
            f"estimator check: the plain client estimate is {100 * cs.client_gap:+.1f} % off the "
            f"{cs.estimator} one (tolerance +-{100 * tol:.1f} %): the server's prefill times differ "
            "between the long and the short requests (queueing counted as prefill, or a /metrics "
            "delta that caught another request)"
        )


def target_ci_stop_rule(cfg: Any) -> Callable[[list[dict[str, Any]]], bool] | None:
    """The adaptive-precision rule for measure.py, or None when cfg.workload.target_ci_pct is None.

    The returned function gets the cell's timed rows so far and answers True when the cell's
    bootstrap interval half-width is below target_ci_pct % of the estimate. With fewer than
    MIN_ROUNDS_FOR_CI usable rounds there is no interval, so it answers False (keep measuring;
    measure.py stops at max_rounds regardless). The width judged is the estimator's that will
    decide: the prefill-corrected one while every valid row has the server's prefill time and
    stats.estimator allows it (its rounds vary 3-4x less at 32K than the client's), else the
    plain client one."""
    from e2e.stats.estimate import CORRECTED

    pct = cfg.workload.target_ci_pct
    if pct is None:
        return None
    n_long, n_short = cfg.workload.long_tokens, cfg.workload.short_tokens
    corrected_allowed = getattr(getattr(cfg, "stats", None), "estimator", "auto") != CLIENT

    def stop(rows: list[dict[str, Any]]) -> bool:
        valid = [r for r in rows if r.get("valid")]
        corrected = corrected_allowed and bool(valid) and all(r.get("server_prefill_s") is not None for r in valid)
        hw = cell_stats(rows, n_long, n_short, estimator=CORRECTED if corrected else CLIENT).half_width_rel
        return hw is not None and hw * 100 < pct

    return stop


def pass_agreement(per_pass: dict[int, CellStats]) -> dict[str, Any]:
    """Same arm, same depth across passes: the largest relative difference (max - min) / min of the
    estimates, and whether it exceeds what the two cells' intervals allow (the difference is larger
    than sqrt(hw_max^2 + hw_min^2), the half-width of their difference). One pass: nothing to say."""
    est = {p: c.estimate for p, c in per_pass.items() if c.estimate is not None}
    if len(est) < 2:
        return {"n_passes": len(est), "max_rel_diff_pct": None, "flagged": False, "passes": None}
    lo_p = min(est, key=lambda p: est[p])
    hi_p = max(est, key=lambda p: est[p])
    lo, hi = per_pass[lo_p].ci, per_pass[hi_p].ci
    rel = (est[hi_p] - est[lo_p]) / est[lo_p]
    flagged = False
    allowed = None
    if lo is not None and hi is not None:
        allowed = math.hypot((lo[1] - lo[0]) / 2, (hi[1] - hi[0]) / 2)
        flagged = est[hi_p] - est[lo_p] > allowed
    return {
        "n_passes": len(est),
        "max_rel_diff_pct": 100 * rel,
        "flagged": flagged,
        "allowed_ms": allowed,
        "passes": [lo_p, hi_p],
    }
