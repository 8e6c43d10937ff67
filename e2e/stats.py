"""Per-cell statistics of decode ms per token. Pure: numbers in, numbers out, no I/O.

What the answers mean (README.md, "Statistics", says it at length):

* A cell is one server at one depth. Its estimate is e2e.estimate's differenced medians,
  (median T_long - median T_short) / (long - short) in ms per token.
* Cell interval: a 95 % percentile bootstrap over ROUNDS (each round holds one long and one short
  request sent back to back; resampling whole rounds keeps that pairing, so slow drift within a
  cell does not widen the interval). A difference of two medians has no distribution-free
  order-statistic interval, hence the bootstrap. Fixed seed: the same rows give the same interval.
  Fewer than MIN_ROUNDS_FOR_CI usable rounds: no interval (None) and a warning.
* Between arms the replication unit is the server (the cell), not the request: e2e/verdicts.py
  compares arms on the per-cell estimates and decides; e2e/changepoints.py finds steps in a series
  of runs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Iterable, Sequence

import numpy as np

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
    # without NaNs a sort gives np.nanmedian's answer exactly, at a twentieth of the cost
    med = _row_median if np.isfinite(long_s).all() and np.isfinite(short_s).all() else np.nanmedian
    with np.errstate(all="ignore"), _quiet_nan():
        ml = med(long_s[idx], axis=1)
        ms = med(short_s[idx], axis=1)
    b = (ml - ms) / (n_long - n_short) * 1e3
    return b[np.isfinite(b)]


def _row_median(x: np.ndarray, axis: int = 1) -> np.ndarray:
    """np.median along rows of a 2-D array (same values: the middle one, or the mean of the two)."""
    s = np.sort(x, axis=axis)
    k = s.shape[1]
    return s[:, k // 2] if k % 2 else (s[:, k // 2 - 1] + s[:, k // 2]) / 2


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

    @cached_property
    def log_se(self) -> float | None:
        """Standard error of log(estimate) from the bootstrap (e2e.verdicts floors the between-server
        variance with its square). Computed once: a cell's bootstrap is not changed once built."""
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

