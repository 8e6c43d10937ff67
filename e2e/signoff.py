"""Paired gsm8k sign-off: two servers answered the same questions; did accuracy change? No I/O.

Each question is scored under arm A and arm B (correct or not, same prompt), so the comparison is
paired: only the questions where the arms disagree (the discordant ones) carry information about a
difference. Definitions used throughout (and written into every summary):

- accuracy: correct / n, with a two-sided Wilson score interval (or Clopper-Pearson "exact").
- discordant counts: a_only = right under A, wrong under B; b_only = wrong under A, right under B.
- change: accuracy(B) - accuracy(A) = (b_only - a_only) / n; its Wald paired interval
  +- z * sqrt(a_only + b_only - (b_only - a_only)^2 / n) / n is shown for scale only.
- McNemar exact test: two-sided binomial test of a_only out of (a_only + b_only) against 1/2
  (scipy.stats.binomtest). With no discordant question there is no evidence of a difference: p = 1.
- verdict "pass" iff p >= alpha (no significant difference) AND the drop accuracy(A) - accuracy(B)
  is at most max_accuracy_drop (absolute fraction; a gain never fails the bound). Otherwise "fail",
  with the reasons. Few questions give little power: a pass at --limit 10 proves only the path.
- text differences: questions whose generated text differs at all between the arms (greedy decoding
  is not reproducible across server processes on every machine: an A/A pair, the same arm on two
  fresh servers, measures that baseline).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Literal

from scipy import stats

IntervalMethod = Literal["wilson", "exact"]


@dataclass(frozen=True, slots=True)
class Answer:
    """One question as one server answered it."""
    doc_id: int
    correct: bool
    response: str                # the generated text, unfiltered
    extracted: str | None = None  # the answer the scoring filter took from it
    doc_hash: str | None = None   # lm-eval's hash of the question document (pairs must agree)


def proportion_interval(k: int, n: int, confidence: float = 0.95,
                        method: IntervalMethod = "wilson") -> tuple[float, float]:
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


def paired_change_interval(a_only: int, b_only: int, n: int,
                           confidence: float = 0.95) -> tuple[float, float]:
    """Wald interval for accuracy(B) - accuracy(A) from paired counts (for scale, not the test)."""
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
        raise ValueError(f"the arms answered different questions (only A: {only_a[:5]}"
                         f"{'...' if len(only_a) > 5 else ''}, only B: {only_b[:5]}"
                         f"{'...' if len(only_b) > 5 else ''})")
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


def compare(a: Iterable[Answer], b: Iterable[Answer], *, alpha: float = 0.05,
            max_accuracy_drop: float = 0.01, interval: IntervalMethod = "wilson") -> dict[str, Any]:
    """The paired sign-off of B against A (see the module docstring for every definition).

    Returns a JSON-ready dict: per-arm accuracy with interval, the 2x2 table, the change and its
    interval, the McNemar p-value, text-difference counts, the verdict and its reasons.
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if max_accuracy_drop < 0:
        raise ValueError(f"max_accuracy_drop must be >= 0, got {max_accuracy_drop}")
    pairs = pair_up(a, b)
    n = len(pairs)
    both = sum(1 for x, y in pairs if x.correct and y.correct)
    a_only = sum(1 for x, y in pairs if x.correct and not y.correct)
    b_only = sum(1 for x, y in pairs if not x.correct and y.correct)
    neither = n - both - a_only - b_only
    conf = 1 - alpha
    acc_a = accuracy_block(both + a_only, n, conf, interval)
    acc_b = accuracy_block(both + b_only, n, conf, interval)
    change = (b_only - a_only) / n
    lo, hi = paired_change_interval(a_only, b_only, n, conf)
    p = mcnemar_exact(a_only, b_only)
    text_diff = sum(1 for x, y in pairs if x.response != y.response)
    answer_diff = sum(1 for x, y in pairs if x.extracted != y.extracted)

    reasons = []
    if p < alpha:
        reasons.append(f"significant difference: exact McNemar p = {p:.3g} < alpha {alpha:g} "
                       f"({a_only} right only under A, {b_only} right only under B)")
    drop = -change
    # A tiny tolerance so that a drop equal to the bound (e.g. 1/100 vs 0.01) is not failed by rounding.
    if drop > max_accuracy_drop + 1e-12:
        reasons.append(f"accuracy dropped {100 * drop:.2f} points, more than the bound "
                       f"{100 * max_accuracy_drop:.2f}")
    return {
        "n": n,
        "a": acc_a,
        "b": acc_b,
        "table": {"both_correct": both, "a_only": a_only, "b_only": b_only, "neither": neither},
        "discordant": a_only + b_only,
        "change": change,
        "change_ci_low": lo,
        "change_ci_high": hi,
        "mcnemar_p": p,
        "text_differ": text_diff,
        "extracted_differ": answer_diff,
        "alpha": alpha,
        "max_accuracy_drop": max_accuracy_drop,
        "interval": interval,
        "verdict": "pass" if not reasons else "fail",
        "reasons": reasons,
    }


def overall_verdict(verdicts: Iterable[str]) -> str:
    """'pass' only if every A/B comparison passed; 'fail' if any failed; else 'incomplete'."""
    vs = list(verdicts)
    if not vs:
        return "incomplete"
    if "fail" in vs:
        return "fail"
    if all(v == "pass" for v in vs):
        return "pass"
    return "incomplete"
