"""Paired gsm8k sign-off: two servers answered the same questions; is B's accuracy no worse than A's
by more than a margin? Pure, no I/O.

Each question is scored under arm A and arm B (correct or not, same prompt), so the comparison is
paired: only the questions where the arms disagree (the discordant ones) carry information about a
difference. Definitions used throughout (and written into every summary):

- accuracy: correct / n, with a two-sided Wilson score interval (or Clopper-Pearson "exact").
- discordant counts: a_only = right under A, wrong under B; b_only = wrong under A, right under B.
- drop = accuracy(A) - accuracy(B) = (a_only - b_only) / n; change = -drop.
- Non-inferiority (the verdict): H0 "the true drop is at least max_accuracy_drop" against H1 "it is
  smaller". Statistic: Tango's (1998) score statistic for paired proportions at the margin. With
  its normal critical value the exact size exceeds alpha = 5 % (6.2 % at n = 10, 5.7 % at 20 and
  5.6 % at 100 for a 1-point margin; 5.3 % at n = 1319 for 2 points when nearly all discordance
  is one way), so the critical value is calibrated to exact size instead: the worst case, over
  the nuisance (the discordance rate), of the exact trinomial probability on the margin
  (critical_values; a conservative fallback, never looser than the normal value). "pass" iff
  that test rejects H0, i.e. the one-sided (1 - alpha) upper bound drop_upper <= max_accuracy_drop;
  "fail" iff the mirror test shows the drop exceeds the margin (drop_lower > max_accuracy_drop);
  else "inconclusive". The bounds invert Tango's statistic at the calibrated critical values.
- McNemar exact test (two-sided binomial of a_only out of a_only + b_only against 1/2) is reported;
  it no longer decides: failing to find a difference is not evidence of no difference.
- text differences: questions whose generated text differs at all between the arms. An A/A pair
  (the same arm on two fresh servers) measures that baseline; excess_over_aa tests whether an arm
  pair flips more answers than the A/A pair (flips both ways cancel in McNemar but are a change).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

import numpy as np
from scipy import optimize, special, stats

IntervalMethod = Literal["wilson", "exact"]


@dataclass(frozen=True, slots=True)
class Answer:
    """One question as one server answered it."""

    doc_id: int
    correct: bool
    response: str  # the generated text, unfiltered
    extracted: str | None = None  # the answer the scoring filter took from it
    doc_hash: str | None = None  # lm-eval's hash of the question document (pairs must agree)


def proportion_interval(
    k: int, n: int, confidence: float = 0.95, method: IntervalMethod = "wilson"
) -> tuple[float, float]:
    """Two-sided interval for k successes out of n (scipy's Wilson score or Clopper-Pearson)."""
    if n <= 0 or not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=confidence, method=method)
    return float(ci.low), float(ci.high)


def mcnemar_exact(a_only: int, b_only: int) -> float:
    """Two-sided exact McNemar p-value from the two discordant counts (1.0 when both are 0)."""
    if a_only < 0 or b_only < 0:
        raise ValueError("discordant counts must be >= 0")
    n = a_only + b_only
    if n == 0:
        return 1.0
    return float(stats.binomtest(a_only, n, 0.5, alternative="two-sided").pvalue)


def paired_change_interval(a_only: int, b_only: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wald interval for accuracy(B) - accuracy(A) from paired counts (for scale only; compare
    reports Tango's interval instead, which does not collapse to a point with few discordant pairs)."""
    d = (b_only - a_only) / n
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    var = max(a_only + b_only - (b_only - a_only) ** 2 / n, 0.0)
    half = z * math.sqrt(var) / n
    return d - half, d + half


def pair_up(a: Iterable[Answer], b: Iterable[Answer]) -> list[tuple[Answer, Answer]]:
    """Match answers by question; the two sides must cover the same questions with the same docs."""
    da = {x.doc_id: x for x in a}
    db = {x.doc_id: x for x in b}
    if not da:
        raise ValueError("no questions to compare")
    if da.keys() != db.keys():
        only_a = sorted(da.keys() - db.keys())
        only_b = sorted(db.keys() - da.keys())
        raise ValueError(
            f"the arms answered different questions (only A: {only_a[:5]}"
            f"{'...' if len(only_a) > 5 else ''}, only B: {only_b[:5]}"
            f"{'...' if len(only_b) > 5 else ''})"
        )
    pairs = []
    for k in sorted(da):
        x, y = da[k], db[k]
        if x.doc_hash and y.doc_hash and x.doc_hash != y.doc_hash:
            raise ValueError(f"question {k} is a different document in the two arms (doc_hash differs)")
        pairs.append((x, y))
    return pairs


def accuracy_block(correct: int, n: int, confidence: float, method: IntervalMethod) -> dict[str, Any]:
    lo, hi = proportion_interval(correct, n, confidence, method)
    return {"correct": correct, "n": n, "accuracy": correct / n, "ci_low": lo, "ci_high": hi}


# -- non-inferiority ----------------------------------------------------------------------------
PSI_GRID = 160  # nuisance values (discordance rates) the exact calibration maximises over
METHOD = (
    "Tango score statistic for the paired drop, critical value calibrated to exact size "
    "(worst case over the discordance rate)"
)
Verdict = Literal["pass", "fail", "inconclusive"]


def tango_z(delta: float, a_only: Any, b_only: Any, n: int) -> np.ndarray:
    """Tango's (1998) score statistic for H0: drop = delta, drop = P(A only) - P(B only), with the
    restricted maximum-likelihood P(B only) under H0; vectorised over the counts, decreasing in
    delta. Large negative: the drop is below delta."""
    b, c = np.asarray(a_only, dtype=float), np.asarray(b_only, dtype=float)
    qa, qb = 2.0 * n, -b - c + (2.0 * n - b + c) * delta
    qc = -c * delta * (1 - delta)
    p21 = (-qb + np.sqrt(np.maximum(qb * qb - 4 * qa * qc, 0.0))) / (2 * qa)
    den = np.sqrt(np.maximum(n * (2 * p21 + delta * (1 - delta)), 0.0))
    num = b - c - n * delta
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.where(num == 0, 0.0, np.sign(num) * np.inf))


def _span(n: int, p: float) -> tuple[int, int]:
    """Counts of Bin(n, p) outside which less than ~1e-15 of the mass lies (8 sd, +10 for small p)."""
    if p <= 0:
        return 0, 0
    sd = math.sqrt(n * p * (1 - p))
    return max(0, math.floor(n * p - 8 * sd - 10)), min(n, math.ceil(n * p + 8 * sd + 10))


def _log_pmf(n: int, b: np.ndarray, c: np.ndarray, p12: float, p21: float) -> np.ndarray:
    """log trinomial probability of (a_only = b, b_only = c, rest); -inf where b + c > n."""
    lg = special.gammaln(np.arange(n + 1) + 1.0)  # lg[k] = log k!
    rest = n - b - c
    ok = rest >= 0
    r = np.where(ok, rest, 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (
            lg[n]
            - lg[b]
            - lg[c]
            - lg[r]
            + special.xlogy(b, p12)
            + special.xlogy(c, p21)
            + special.xlogy(r, max(0.0, 1 - p12 - p21))
        )  # 1 - p12 - p21 may round below 0
    return np.where(ok, out, -np.inf)


def _trinomial(n: int, p12: float, p21: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(a_only, b_only, probability) over the cells holding all but ~1e-14 of the mass."""
    (b0, b1), (c0, c1) = _span(n, p12), _span(n, p21)
    b, c = np.meshgrid(np.arange(b0, b1 + 1), np.arange(c0, c1 + 1), indexing="ij")
    b, c = b.ravel(), c.ravel()
    pmf = np.exp(_log_pmf(n, b, c, p12, p21))
    keep = pmf > 0
    return b[keep], c[keep], pmf[keep]


def _psi_grid(margin: float) -> np.ndarray:
    """Discordance rates from the margin to 1, dense at both ends (where the size moves fastest:
    nearly all discordance one way, and nearly every question discordant)."""
    k = PSI_GRID // 2
    g = np.concatenate([[0.0], np.geomspace(1e-5, 0.5, k), 1 - np.geomspace(1e-5, 0.5, PSI_GRID - k - 2), [1.0]])
    return margin + (1 - margin) * np.unique(g)


@lru_cache(maxsize=128)
def critical_values(n: int, margin: float, alpha: float) -> tuple[float, float]:
    """(u, l) for T = tango_z(margin, ...): pass iff T < u and T <= -z, fail iff T > l and T >= z,
    z = z_(1 - alpha). u (l) is the smallest (largest) attainable T whose lower (upper) tail
    exceeds alpha at some discordance rate on the margin, so the exact size of either test,
    maximised over the grid of discordance rates, is <= alpha. (With ties no index juggling is
    needed: the first sorted index where the running mass passes alpha carries the cut value.)"""
    bmax, cmax = _span(n, (1 + margin) / 2)[1], _span(n, (1 - margin) / 2)[1]
    t_all = tango_z(margin, np.arange(bmax + 1)[:, None], np.arange(cmax + 1)[None, :], n)
    u, lo = math.inf, -math.inf
    for psi in _psi_grid(margin):
        p12, p21 = (psi + margin) / 2, (psi - margin) / 2
        (b0, b1), (c0, c1) = _span(n, p12), _span(n, p21)
        b, c = np.arange(b0, b1 + 1)[:, None], np.arange(c0, c1 + 1)[None, :]
        pmf = np.exp(_log_pmf(n, b, c, p12, p21)).ravel()
        t = t_all[b0 : b1 + 1, c0 : c1 + 1].ravel()
        order = np.argsort(t, kind="stable")
        ts, ps = t[order], pmf[order]
        j = int(np.searchsorted(np.cumsum(ps), alpha, side="right"))  # P(T <= ts[j]) > alpha
        if j < ts.size:
            u = min(u, float(ts[j]))
        j = int(np.searchsorted(np.cumsum(ps[::-1]), alpha, side="right"))  # P(T >= ts[-1-j]) > alpha
        if j < ts.size:
            lo = max(lo, float(ts[::-1][j]))
    return u, lo


def ni_test(a_only: Any, b_only: Any, n: int, margin: float, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """(passed, failed), vectorised over the discordant counts: the verdict of compare()."""
    u, lo = critical_values(int(n), float(margin), float(alpha))
    z = float(stats.norm.ppf(1 - alpha))
    t = tango_z(margin, a_only, b_only, n)
    return (t < u) & (t <= -z), (t > lo) & (t >= z)


def _bound(a_only: int, b_only: int, n: int, cut: float, upper: bool) -> float:
    """The drop where Tango's statistic crosses `cut` (the one-sided confidence bound)."""
    d = (a_only - b_only) / n
    end = 1.0 if upper else -1.0
    if not math.isfinite(cut):
        return end

    def f(x: float) -> float:
        return float(tango_z(x, a_only, b_only, n)) - cut

    if (f(end) >= 0) if upper else (f(end) <= 0):
        return end
    return float(optimize.brentq(f, d, end, xtol=1e-12)) if upper else float(optimize.brentq(f, end, d, xtol=1e-12))


def noninferiority(a_only: int, b_only: int, n: int, margin: float, alpha: float) -> dict[str, Any]:
    """The verdict and its bounds from the discordant counts (see the module docstring)."""
    u, lo = critical_values(int(n), float(margin), float(alpha))
    z = float(stats.norm.ppf(1 - alpha))
    passed, failed = ni_test(a_only, b_only, n, margin, alpha)
    verdict: Verdict = "pass" if bool(passed) else "fail" if bool(failed) else "inconclusive"
    return {
        "drop": (a_only - b_only) / n,
        "drop_upper": _bound(a_only, b_only, n, min(u, -z), True),
        "drop_lower": _bound(a_only, b_only, n, max(lo, z), False),
        "verdict": verdict,
        "method": METHOD,
    }


def pass_probability(n: int, p_a_only: float, p_b_only: float, margin: float, alpha: float) -> dict[str, float]:
    """Exact probabilities of each verdict when the true discordance rates are given (enumeration)."""
    b, c, pmf = _trinomial(n, p_a_only, p_b_only)
    passed, failed = ni_test(b, c, n, margin, alpha)
    p, f = float(pmf[passed].sum()), float(pmf[failed].sum())
    return {"pass": p, "fail": f, "inconclusive": max(0.0, 1.0 - p - f)}


def min_questions(margin: float, alpha: float) -> int | None:
    """The fewest questions at which even perfect agreement (no discordant answer) passes: below
    it no run can show a drop below the margin. None for margin 0 (never)."""
    if margin <= 0:
        return None
    z = float(stats.norm.ppf(1 - alpha))

    def ok(n: int) -> bool:
        return bool(ni_test(0, 0, n, margin, alpha)[0])

    # two necessary conditions: Tango's own (z^2 (1 - m) / m), and the exact one: with all the
    # discordance one way on the margin, no discordant answer at all has probability (1 - m)^n
    lo = max(1, math.ceil(z * z * (1 - margin) / margin), math.ceil(math.log(alpha) / math.log1p(-margin)))
    if ok(lo):
        return lo
    hi = lo
    while not ok(hi):
        lo, hi = hi, math.ceil(hi * 1.25) + 1
    while hi - lo > 1:  # ok(hi), not ok(lo)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def questions_needed(
    margin: float, alpha: float = 0.05, power: float = 0.80, discordance: float = 0.0, true_drop: float = 0.0
) -> int | None:
    """Questions for the sign-off to pass with `power` when the true drop is true_drop and a
    fraction `discordance` of the questions is answered differently (asymptotic, Tango's variance;
    never below min_questions). None when it cannot pass (true_drop >= margin)."""
    if not 0 <= abs(true_drop) <= discordance <= 1:
        raise ValueError(f"need |true_drop| <= discordance <= 1, got {true_drop}, {discordance}")
    if true_drop >= margin:
        return None
    p12, p21 = (discordance + true_drop) / 2, (discordance - true_drop) / 2
    qb = -p12 - p21 + (2 - p12 + p21) * margin
    qc = -p21 * margin * (1 - margin)
    r21 = (-qb + math.sqrt(max(qb * qb - 8 * qc, 0.0))) / 4
    s0 = math.sqrt(2 * r21 + margin * (1 - margin))
    s1 = math.sqrt(max(discordance - true_drop**2, 0.0))
    za, zb = float(stats.norm.ppf(1 - alpha)), float(stats.norm.ppf(power))
    n = math.ceil(((za * s0 + zb * s1) / (margin - true_drop)) ** 2)
    return max(n, min_questions(margin, alpha) or 0)


def excess_over_aa(
    k_ab: int, n_ab: int, k_aa: int, n_aa: int, alpha: float = 0.05, what: str = "discordant"
) -> dict[str, Any]:
    """Does the arm pair change more answers than the A/A pair (the same arm on two servers)?
    One-sided Fisher exact test of k_ab / n_ab > k_aa / n_aa. The pairs answered the same
    questions, so the counts are positively correlated and the test is conservative. Reported
    beside the verdict, not part of it: a kernel change may legitimately flip a few answers."""
    if not (0 <= k_ab <= n_ab and 0 <= k_aa <= n_aa and n_ab > 0 and n_aa > 0):
        raise ValueError(f"need 0 <= k <= n, n > 0 (got {k_ab}/{n_ab}, {k_aa}/{n_aa})")
    p = float(stats.fisher_exact([[k_ab, n_ab - k_ab], [k_aa, n_aa - k_aa]], alternative="greater").pvalue)
    return {
        "what": what,
        "ab": k_ab,
        "ab_n": n_ab,
        "aa": k_aa,
        "aa_n": n_aa,
        "ab_rate": k_ab / n_ab,
        "aa_rate": k_aa / n_aa,
        "p": p,
        "flagged": p < alpha,
        "test": "one-sided Fisher exact (arm pair more than the A/A pair); reported, does not decide",
    }


def aa_check(ab: dict[str, Any], aa: dict[str, Any], alpha: float = 0.05) -> dict[str, Any]:
    """excess_over_aa for the discordant and the text-differ counts of two compare() results."""
    return {k: excess_over_aa(ab[k], ab["n"], aa[k], aa["n"], alpha, k) for k in ("discordant", "text_differ")}


def compare(
    a: Iterable[Answer],
    b: Iterable[Answer],
    *,
    alpha: float = 0.05,
    max_accuracy_drop: float = 0.01,
    interval: IntervalMethod = "wilson",
) -> dict[str, Any]:
    """The paired sign-off of B against A (see the module docstring for every definition).

    Returns a JSON-ready dict: per-arm accuracy with interval, the 2x2 table, the change and its
    (two-sided Tango) interval, the McNemar p-value, text-difference counts, the one-sided bounds
    of the drop, the verdict and its reasons, notes that do not decide, and the questions a pass
    would need.
    """
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha}")
    if not 0 <= max_accuracy_drop < 1:
        raise ValueError(f"max_accuracy_drop must be in [0, 1), got {max_accuracy_drop}")
    pairs = pair_up(a, b)
    n = len(pairs)
    both, a_only, b_only = _paired_table(pairs)
    neither = n - both - a_only - b_only
    conf = 1 - alpha
    z2 = float(stats.norm.ppf(1 - alpha / 2))
    ni = noninferiority(a_only, b_only, n, max_accuracy_drop, alpha)
    p = mcnemar_exact(a_only, b_only)
    m_min = min_questions(max_accuracy_drop, alpha)
    psi = (a_only + b_only) / n
    need = questions_needed(max_accuracy_drop, alpha, 0.80, psi) if max_accuracy_drop > 0 else None
    reasons = _reasons(ni, n, a_only, b_only, max_accuracy_drop, conf, m_min, need)
    notes = _mcnemar_notes(p, alpha, a_only, b_only)
    return {
        "n": n,
        "a": accuracy_block(both + a_only, n, conf, interval),
        "b": accuracy_block(both + b_only, n, conf, interval),
        "table": {"both_correct": both, "a_only": a_only, "b_only": b_only, "neither": neither},
        "discordant": a_only + b_only,
        "change": (b_only - a_only) / n,
        "change_ci_low": -_bound(a_only, b_only, n, -z2, True),
        "change_ci_high": -_bound(a_only, b_only, n, z2, False),
        "mcnemar_p": p,
        "text_differ": sum(1 for x, y in pairs if x.response != y.response),
        "extracted_differ": sum(1 for x, y in pairs if x.extracted != y.extracted),
        "alpha": alpha,
        "max_accuracy_drop": max_accuracy_drop,
        "interval": interval,
        "drop": ni["drop"],
        "drop_upper": ni["drop_upper"],
        "drop_lower": ni["drop_lower"],
        "method": ni["method"],
        "min_questions": m_min,
        "questions_needed": need,
        "verdict": ni["verdict"],
        "reasons": reasons,
        "notes": notes,
    }


def _paired_table(pairs: list[tuple[Answer, Answer]]) -> tuple[int, int, int]:
    """The paired 2x2 table's cells that carry counts: right under both arms, under A only, under B only."""
    both = sum(1 for x, y in pairs if x.correct and y.correct)
    a_only = sum(1 for x, y in pairs if x.correct and not y.correct)
    b_only = sum(1 for x, y in pairs if not x.correct and y.correct)
    return both, a_only, b_only


def _mcnemar_notes(p: float, alpha: float, a_only: int, b_only: int) -> list[str]:
    """McNemar's test, said where it finds a difference: a note beside the verdict, which it does not decide."""
    if p >= alpha:
        return []
    return [
        f"exact McNemar p = {p:.3g} < {alpha:g}: accuracy differs ({a_only} right only "
        f"under A, {b_only} only under B); the verdict is the non-inferiority test"
    ]


def _reasons(
    ni: dict[str, Any],
    n: int,
    a_only: int,
    b_only: int,
    margin: float,
    conf: float,
    m_min: int | None,
    need: int | None,
) -> list[str]:
    """Why the verdict is not "pass", in words: the bound that decided it, and for "inconclusive"
    what more questions could do."""
    pts = f"one-sided {100 * conf:g} %"
    if ni["verdict"] == "fail":
        return [
            f"the drop exceeds the margin: {pts} lower bound {100 * ni['drop_lower']:.2f} points "
            f"> {100 * margin:.2f} ({a_only} right only under A, {b_only} only under B)"
        ]
    if ni["verdict"] != "inconclusive":
        return []
    r = (
        f"not shown within the margin: {pts} upper bound of the drop {100 * ni['drop_upper']:.2f} "
        f"points > {100 * margin:.2f}"
    )
    if m_min is None:
        r += "; a margin of 0 is shown only when B is significantly better"
    elif n < m_min:
        r += (
            f"; {n} questions cannot show a drop below the margin: it needs at least {m_min} "
            "even with no discordant answer"
        )
    elif need is not None:
        r += f"; at this discordance ({100 * ((a_only + b_only) / n):.1f} %) about {need} questions give 80 % power"
    return [r]


def overall_verdict(verdicts: Iterable[str]) -> str:
    """'pass' only if every primary comparison passed; 'fail' if any failed; else 'incomplete' when
    a comparison lacks a unit's result (or there is none), else 'inconclusive'."""
    vs = list(verdicts)
    if not vs:
        return "incomplete"
    if "fail" in vs:
        return "fail"
    if all(v == "pass" for v in vs):
        return "pass"
    return "incomplete" if "incomplete" in vs else "inconclusive"
