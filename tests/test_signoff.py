"""The paired gsm8k statistics (e2e/signoff.py) on constructed cases, against hand-computed values."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st
from scipy import stats

from e2e.signoff import (Answer, compare, mcnemar_exact, overall_verdict, pair_up,
                         paired_change_interval, proportion_interval)

Z95 = 1.959963984540054


def answers(correct: list[bool], texts: list[str] | None = None) -> list[Answer]:
    texts = texts or [f"answer {i} {'right' if c else 'wrong'}" for i, c in enumerate(correct)]
    return [Answer(doc_id=i, correct=c, response=t, extracted=t.split()[-1]) for i, (c, t)
            in enumerate(zip(correct, texts))]


def paired(n: int, both: int, a_only: int, b_only: int) -> tuple[list[Answer], list[Answer]]:
    """n questions with the given 2x2 table (the rest wrong under both)."""
    a = [True] * both + [True] * a_only + [False] * b_only
    b = [True] * both + [False] * a_only + [True] * b_only
    rest = n - len(a)
    return answers(a + [False] * rest), answers(b + [False] * rest)


def wilson_by_hand(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


# -- McNemar, by hand: two-sided exact = 2 * P(X <= min) for X ~ Bin(a_only + b_only, 1/2), capped at 1
@pytest.mark.parametrize("a_only,b_only,p", [
    (0, 5, 2 / 32),              # 2 * 0.5^5
    (1, 9, 2 * 11 / 1024),       # 2 * (1 + 10) / 2^10
    (9, 1, 2 * 11 / 1024),       # symmetric
    (2, 0, 0.5),                 # 2 * 0.5^2
    (5, 5, 1.0),
    (0, 0, 1.0),                 # no discordant pair: no evidence of a difference
    (3, 1, 2 * 5 / 16),          # 2 * (1 + 4) / 2^4
])
def test_mcnemar_exact_matches_hand_values(a_only, b_only, p):
    assert mcnemar_exact(a_only, b_only) == pytest.approx(p, rel=1e-12)


def test_mcnemar_rejects_negative_counts():
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 3)


# -- intervals --------------------------------------------------------------------------------------
@pytest.mark.parametrize("k,n", [(0, 10), (3, 10), (10, 10), (500, 1319), (1, 1319)])
def test_wilson_interval_matches_the_formula(k, n):
    lo, hi = proportion_interval(k, n, 0.95, "wilson")
    hlo, hhi = wilson_by_hand(k, n)
    assert lo == pytest.approx(hlo, abs=1e-9) and hi == pytest.approx(hhi, abs=1e-9)
    assert lo <= k / n <= hi


def test_exact_interval_matches_clopper_pearson_by_hand():
    # k = 0: upper = 1 - (alpha/2)^(1/n); k = n: lower = (alpha/2)^(1/n)
    lo, hi = proportion_interval(0, 10, 0.95, "exact")
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / 10), rel=1e-9)
    lo, hi = proportion_interval(10, 10, 0.95, "exact")
    assert hi == 1.0 and lo == pytest.approx(0.025 ** (1 / 10), rel=1e-9)
    # interior: the beta quantiles
    lo, hi = proportion_interval(3, 10, 0.95, "exact")
    assert lo == pytest.approx(stats.beta.ppf(0.025, 3, 8), rel=1e-9)
    assert hi == pytest.approx(stats.beta.ppf(0.975, 4, 7), rel=1e-9)


@pytest.mark.parametrize("k,n", [(-1, 5), (6, 5), (0, 0)])
def test_interval_rejects_impossible_counts(k, n):
    with pytest.raises(ValueError):
        proportion_interval(k, n)


def test_paired_change_interval_by_hand():
    lo, hi = paired_change_interval(3, 1, 100, 0.95)
    half = Z95 * math.sqrt(4 - 4 / 100) / 100
    assert lo == pytest.approx(-0.02 - half) and hi == pytest.approx(-0.02 + half)


# -- the verdict on constructed cases -----------------------------------------------------------------
def test_identical_answers_pass_with_nothing_discordant():
    a = answers([True, False, True, True, False])
    r = compare(a, a, alpha=0.05, max_accuracy_drop=0.01)
    assert r["verdict"] == "pass" and r["reasons"] == []
    assert r["mcnemar_p"] == 1.0 and r["discordant"] == 0 and r["text_differ"] == 0
    assert r["a"]["accuracy"] == r["b"]["accuracy"] == 0.6
    assert r["table"] == {"both_correct": 3, "a_only": 0, "b_only": 0, "neither": 2}


def test_large_significant_drop_fails_for_both_reasons():
    a, b = paired(100, both=40, a_only=10, b_only=0)
    r = compare(a, b, alpha=0.05, max_accuracy_drop=0.01)
    assert r["verdict"] == "fail"
    assert r["mcnemar_p"] == pytest.approx(2 * 0.5 ** 10)
    assert r["change"] == pytest.approx(-0.10)
    assert r["a"]["accuracy"] == 0.5 and r["b"]["accuracy"] == 0.4
    assert len(r["reasons"]) == 2
    assert "significant" in r["reasons"][0] and "dropped 10.00 points" in r["reasons"][1]


def test_drop_beyond_the_bound_fails_even_when_not_significant():
    a, b = paired(100, both=30, a_only=3, b_only=1)
    r = compare(a, b, alpha=0.05, max_accuracy_drop=0.01)
    assert r["mcnemar_p"] == pytest.approx(0.625)
    assert r["change"] == pytest.approx(-0.02)
    assert r["verdict"] == "fail" and len(r["reasons"]) == 1 and "bound 1.00" in r["reasons"][0]
    # the same table passes under a looser bound
    assert compare(a, b, alpha=0.05, max_accuracy_drop=0.05)["verdict"] == "pass"


def test_significant_gain_also_fails_no_significant_difference_is_required():
    a, b = paired(100, both=30, a_only=0, b_only=10)
    r = compare(a, b, alpha=0.05, max_accuracy_drop=0.01)
    assert r["change"] == pytest.approx(0.10)
    assert r["verdict"] == "fail" and len(r["reasons"]) == 1 and "significant" in r["reasons"][0]


def test_drop_equal_to_the_bound_passes():
    a, b = paired(100, both=30, a_only=1, b_only=0)
    r = compare(a, b, alpha=0.05, max_accuracy_drop=0.01)
    assert r["change"] == pytest.approx(-0.01) and r["verdict"] == "pass"


def test_small_gain_passes():
    a, b = paired(200, both=50, a_only=2, b_only=4)
    r = compare(a, b, alpha=0.05, max_accuracy_drop=0.01)
    assert r["verdict"] == "pass" and r["change"] == pytest.approx(0.01)
    assert r["mcnemar_p"] == pytest.approx(stats.binomtest(2, 6, 0.5).pvalue)


def test_alpha_decides_significance():
    a, b = paired(1000, both=300, a_only=9, b_only=1)   # p = 2 * 11 / 1024 = 0.0215
    assert compare(a, b, alpha=0.05, max_accuracy_drop=0.05)["verdict"] == "fail"
    assert compare(a, b, alpha=0.01, max_accuracy_drop=0.05)["verdict"] == "pass"


def test_text_and_extracted_differences_counted_even_when_scores_agree():
    a = answers([True, False, False], ["x = 5. The answer is 5", "so 7", "gives 9"])
    b = answers([True, False, False], ["x=5. The answer is 5", "so 7", "gives 8"])
    r = compare(a, b)
    assert r["discordant"] == 0 and r["verdict"] == "pass"
    assert r["text_differ"] == 2 and r["extracted_differ"] == 1


def test_pairing_is_by_question_not_by_position():
    a = answers([True, False, True])
    b = list(reversed(answers([True, False, True])))
    r = compare(a, b)
    assert r["discordant"] == 0 and r["text_differ"] == 0


def test_different_question_sets_are_refused():
    a = answers([True, False, True])
    with pytest.raises(ValueError, match="different questions"):
        compare(a, a[:2])


def test_same_id_different_document_is_refused():
    a = [Answer(0, True, "r", "1", doc_hash="h0"), Answer(1, True, "r", "1", doc_hash="h1")]
    b = [Answer(0, True, "r", "1", doc_hash="h0"), Answer(1, True, "r", "1", doc_hash="XX")]
    with pytest.raises(ValueError, match="doc_hash"):
        pair_up(a, b)


def test_nothing_to_compare_is_refused():
    with pytest.raises(ValueError):
        compare([], [])


@pytest.mark.parametrize("kw", [{"alpha": 0}, {"alpha": 1}, {"max_accuracy_drop": -0.1}])
def test_bad_parameters_are_refused(kw):
    a = answers([True])
    with pytest.raises(ValueError):
        compare(a, a, **kw)


def test_overall_verdict():
    assert overall_verdict(["pass", "pass"]) == "pass"
    assert overall_verdict(["pass", "fail", "incomplete"]) == "fail"
    assert overall_verdict(["pass", "incomplete"]) == "incomplete"
    assert overall_verdict([]) == "incomplete"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=60))
def test_swapping_the_arms_mirrors_the_result(outcomes):
    a = answers([x for x, _ in outcomes])
    b = answers([y for _, y in outcomes])
    ab, ba = compare(a, b), compare(b, a)
    assert ab["mcnemar_p"] == pytest.approx(ba["mcnemar_p"])
    assert ab["change"] == pytest.approx(-ba["change"])
    assert ab["table"]["a_only"] == ba["table"]["b_only"]
    t = ab["table"]
    assert t["both_correct"] + t["a_only"] + t["b_only"] + t["neither"] == len(outcomes)
    assert 0 <= ab["mcnemar_p"] <= 1
    assert ab["a"]["ci_low"] <= ab["a"]["accuracy"] <= ab["a"]["ci_high"]
