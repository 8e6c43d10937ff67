"""The bootstrap of a cell's differenced estimate: replicates resampled by whole rounds (each round
holds one long and one short request sent back to back; resampling rounds keeps that pairing), and
the percentile interval of replicates. Pure; a fixed seed gives the same replicates from the same rows
(e2e/stats/cells.py passes its SEED)."""

from __future__ import annotations

from types import TracebackType

import numpy as np

N_BOOT = 2000  # replicates per interval


def bootstrap_estimates(
    long_s: np.ndarray, short_s: np.ndarray, n_long: int, n_short: int, *, seed: int, n_boot: int = N_BOOT
) -> np.ndarray:
    """Bootstrap replicates of the differenced estimate (ms/token), resampling whole rounds.
    Replicates whose resample holds no valid long or no valid short row are dropped."""
    k = len(long_s)
    if k == 0:
        return np.array([])
    idx = np.random.default_rng(seed).integers(0, k, size=(n_boot, k))
    # without NaNs a sort gives np.nanmedian's answer exactly, at a twentieth of the cost
    med = row_median if np.isfinite(long_s).all() and np.isfinite(short_s).all() else np.nanmedian
    with np.errstate(all="ignore"), _quiet_nan():
        ml = med(long_s[idx], axis=1)
        ms = med(short_s[idx], axis=1)
    b = (ml - ms) / (n_long - n_short) * 1e3
    kept: np.ndarray = b[np.isfinite(b)]
    return kept


def row_median(x: np.ndarray, axis: int = 1) -> np.ndarray:
    """np.median along rows of a 2-D array (same values: the middle one, or the mean of the two)."""
    s = np.sort(x, axis=axis)
    k = s.shape[1]
    mid: np.ndarray = s[:, k // 2] if k % 2 else (s[:, k // 2 - 1] + s[:, k // 2]) / 2
    return mid


class _quiet_nan:
    """np.nanmedian warns on all-NaN rows; those replicates are dropped anyway."""

    def __enter__(self) -> None:
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._w.__exit__(kind, exc, tb)


def percentile_ci(samples: np.ndarray, level: float) -> tuple[float, float] | None:
    """The two-sided percentile interval of replicates at `level`; None without any."""
    if samples.size == 0:
        return None
    a = (1 - level) / 2
    lo, hi = np.quantile(samples, [a, 1 - a])
    return float(lo), float(hi)


def paired_bootstrap(long_s: np.ndarray, short_s: np.ndarray, n_long: int, n_short: int, seed: int) -> np.ndarray:
    """Bootstrap replicates without dropping any (same length and seed: the same resampled rounds)."""
    k = len(long_s)
    idx = np.random.default_rng(seed).integers(0, k, size=(N_BOOT, k))
    b: np.ndarray = (row_median(long_s[idx]) - row_median(short_s[idx])) / (n_long - n_short) * 1e3
    return b
