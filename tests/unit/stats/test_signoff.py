"""The paired gsm8k statistics (e2e/stats/signoff.py) on constructed cases, against hand-computed values,
scipy, and exact enumeration (rates over simulated runs: tests/unit/validation/test_conformance.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize, stats

from e2e.stats import signoff
from e2e.stats.signoff import (
    Answer,
    compare,
    mcnemar_exact,
    min_questions,
    overall_verdict,
    pair_up,
    paired_change_interval,
    proportion_interval,
)

Z95 = 1.959963984540054


def answers(correct: list[bool], texts: list[str] | None = None) -> list[Answer]:
    texts = texts or [f"answer {i} {'right' if c else 'wrong'}" for i, c in enumerate(correct)]
    return [
        Answer(doc_id=i, correct=c, response=t, extracted=t.split()[-1]) for i, (c, t) in enumerate(zip(correct, texts))
    ]


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
@pytest.mark.parametrize(
    "a_only,b_only,p",
    [
        (0, 5, 2 / 32),  # 2 * 0.5^5
        (1, 9, 2 * 11 / 1024),  # 2 * (1 + 10) / 2^10
        (9, 1, 2 * 11 / 1024),  # symmetric
        (2, 0, 0.5),  # 2 * 0.5^2
        (5, 5, 1.0),
        (0, 0, 1.0),  # no discordant pair: no evidence of a difference
        (3, 1, 2 * 5 / 16),  # 2 * (1 + 4) / 2^4
    ],
)
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
def test_identical_answers_pass_with_enough_questions():
    a = answers([True, False, True, True, False] * 80)  # 400 questions, none discordant
    r = compare(a, a, alpha=0.05, max_accuracy_drop=0.01)
    assert r["verdict"] == "pass" and r["reasons"] == [] and r["notes"] == []
    assert r["mcnemar_p"] == 1.0 and r["discordant"] == 0 and r["text_differ"] == 0
    assert r["a"]["accuracy"] == r["b"]["accuracy"] == 0.6
    assert r["table"] == {"both_correct": 240, "a_only": 0, "b_only": 0, "neither": 160}
    assert r["drop"] == 0 and r["drop_lower"] < 0 < r["drop_upper"] <= 0.01


def test_identical_answers_at_a_small_limit_are_inconclusive():
    # --limit 10 used to pass anything without a discordant answer: 10 questions cannot show a
    # drop below one point
    a = answers([True, False, True, True, False] * 2)
    r = compare(a, a, alpha=0.05, max_accuracy_drop=0.01)
    assert r["verdict"] == "inconclusive" and r["min_questions"] == min_questions(0.01, 0.05)
    need = f"10 questions cannot show a drop below the margin: it needs at least {r['min_questions']}"
    assert need in r["reasons"][0]


def test_large_significant_drop_fails():
    a, b = paired(100, both=40, a_only=10, b_only=0)
    r = compare(a, b, alpha=0.05, max_accuracy_drop=0.01)
    assert r["verdict"] == "fail" and r["drop_lower"] > 0.01
    assert r["mcnemar_p"] == pytest.approx(2 * 0.5**10)
    assert r["change"] == pytest.approx(-0.10)
    assert r["a"]["accuracy"] == 0.5 and r["b"]["accuracy"] == 0.4
    assert len(r["reasons"]) == 1 and "exceeds the margin" in r["reasons"][0]
    assert len(r["notes"]) == 1 and "McNemar" in r["notes"][0]


def test_a_drop_beyond_the_bound_without_evidence_is_inconclusive_not_fail():
    a, b = paired(100, both=30, a_only=3, b_only=1)
    r = compare(a, b, alpha=0.05, max_accuracy_drop=0.01)
    assert r["mcnemar_p"] == pytest.approx(0.625)
    assert r["change"] == pytest.approx(-0.02)
    assert r["verdict"] == "inconclusive" and r["drop_lower"] <= 0.01 < r["drop_upper"]
    # the same table passes a loose enough bound
    assert compare(a, b, alpha=0.05, max_accuracy_drop=0.10)["verdict"] == "pass"


def test_a_significant_gain_passes():
    a, b = paired(100, both=30, a_only=0, b_only=10)
    r = compare(a, b, alpha=0.05, max_accuracy_drop=0.01)
    assert r["change"] == pytest.approx(0.10) and r["drop_upper"] < 0
    assert r["verdict"] == "pass" and r["reasons"] == [] and "McNemar" in r["notes"][0]


def test_a_drop_equal_to_the_bound_is_not_a_pass():
    a, b = paired(1319, both=600, a_only=20, b_only=7)  # drop 13/1319 ~ the bound
    r = compare(a, b, alpha=0.05, max_accuracy_drop=13 / 1319)
    assert r["drop"] == pytest.approx(13 / 1319) and r["verdict"] == "inconclusive"


def test_a_small_drop_passes_with_many_questions():
    a, b = paired(1319, both=600, a_only=12, b_only=10)
    r = compare(a, b, alpha=0.05, max_accuracy_drop=0.01)
    assert r["verdict"] == "pass" and r["change"] == pytest.approx(-2 / 1319)
    assert r["mcnemar_p"] == pytest.approx(stats.binomtest(12, 22, 0.5).pvalue)


def test_alpha_decides():
    a, b = paired(1000, both=300, a_only=10, b_only=10)  # upper bound ~ z * sqrt(0.02 / 1000)
    assert compare(a, b, alpha=0.05, max_accuracy_drop=0.01)["verdict"] == "pass"
    assert compare(a, b, alpha=0.01, max_accuracy_drop=0.01)["verdict"] == "inconclusive"


def test_text_and_extracted_differences_counted_even_when_scores_agree():
    a = answers([True, False, False], ["x = 5. The answer is 5", "so 7", "gives 9"])
    b = answers([True, False, False], ["x=5. The answer is 5", "so 7", "gives 8"])
    r = compare(a, b)
    assert r["discordant"] == 0 and r["verdict"] == "inconclusive"  # 3 questions: too few
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


@pytest.mark.parametrize(
    "kw", [{"alpha": 0}, {"alpha": 1}, {"alpha": 0.5}, {"max_accuracy_drop": -0.1}, {"max_accuracy_drop": 1.0}]
)
def test_bad_parameters_are_refused(kw):
    a = answers([True])
    with pytest.raises(ValueError):
        compare(a, a, **kw)


def test_overall_verdict():
    assert overall_verdict(["pass", "pass"]) == "pass"
    assert overall_verdict(["pass", "fail", "incomplete"]) == "fail"
    assert overall_verdict(["pass", "inconclusive", "fail"]) == "fail"
    assert overall_verdict(["pass", "incomplete", "inconclusive"]) == "incomplete"
    assert overall_verdict(["pass", "inconclusive"]) == "inconclusive"
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
    # the two-sided (Tango) interval of the change mirrors; the one-sided bounds bracket the drop
    assert ab["change_ci_low"] == pytest.approx(-ba["change_ci_high"], abs=1e-9)
    assert ab["change_ci_low"] <= ab["change"] <= ab["change_ci_high"]
    assert ab["drop_lower"] <= ab["drop"] <= ab["drop_upper"]


# -- non-inferiority: Tango's statistic, the exact calibration, planning ------------------------------
def _tango_by_numerical_mle(delta, b, c, n):
    """Tango's statistic with the restricted MLE of P(B only) found numerically."""

    def nll(q):
        return -(b * math.log(q + delta) + c * math.log(q) + (n - b - c) * math.log(1 - 2 * q - delta))

    lo, hi = max(0.0, -delta) + 1e-12, (1 - delta) / 2 - 1e-12
    q = optimize.minimize_scalar(nll, bounds=(lo, hi), method="bounded", options={"xatol": 1e-13}).x
    return (b - c - n * delta) / math.sqrt(n * (2 * q + delta * (1 - delta)))


@pytest.mark.parametrize(
    "delta,b,c,n", [(0.01, 12, 10, 1319), (0.05, 3, 1, 100), (-0.02, 5, 9, 200), (0.1, 30, 2, 120), (0.0, 4, 7, 50)]
)
def test_tango_statistic_uses_the_restricted_mle(delta, b, c, n):
    assert float(signoff.tango_z(delta, b, c, n)) == pytest.approx(_tango_by_numerical_mle(delta, b, c, n), rel=1e-6)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 400), st.data())
def test_tango_statistic_decreases_in_delta_and_bounds_hit_the_cut(n, data):
    b = data.draw(st.integers(0, n))
    c = data.draw(st.integers(0, n - b))
    z = signoff.tango_z(np.linspace(-0.99, 0.99, 199)[:, None], b, c, n).ravel()
    assert np.all(np.diff(z) <= 1e-9)
    r = signoff.noninferiority(b, c, n, 0.02, 0.05)
    u, lo = signoff.critical_values(n, 0.02, 0.05)
    up = r["drop_upper"]
    if up < 1:
        assert float(signoff.tango_z(up, b, c, n)) == pytest.approx(min(u, -stats.norm.ppf(0.95)), abs=1e-6)
    assert (r["verdict"] == "pass") == (up <= 0.02 + 1e-9 and float(signoff.tango_z(0.02, b, c, n)) < u)


@pytest.mark.parametrize("margin", [0.0, 0.01, 0.02, 0.05, 0.10, 0.20])
def test_critical_values_are_at_least_as_strict_as_the_normal(margin):
    z = stats.norm.ppf(0.95)
    for n in (10, 100):
        u, lo = signoff.critical_values(n, margin, 0.05)
        assert -2.5 < u <= -z + 0.05 and z - 0.05 <= lo < 2.5  # finite, near z, never looser by much


@pytest.mark.parametrize("n,margin", [(10, 0.05), (37, 0.01), (150, 0.02)])
def test_exact_size_off_the_calibration_grid(n, margin):
    # the calibration maximises over a grid of discordance rates; check 150 rates off that grid
    worst_pass = worst_fail = 0.0
    for psi in np.linspace(margin + 1e-4, 1 - 1e-4, 150):
        r = signoff.pass_probability(n, (psi + margin) / 2, (psi - margin) / 2, margin, 0.05)
        worst_pass, worst_fail = max(worst_pass, r["pass"]), max(worst_fail, r["fail"])
    assert worst_pass <= 0.05 + 5e-4 and worst_fail <= 0.05 + 5e-4


def test_uncalibrated_tango_is_anti_conservative_at_small_n():
    # why the calibration exists: with the normal critical value the size exceeds alpha
    n, m, z = 20, 0.01, stats.norm.ppf(0.95)
    worst = 0.0
    for psi in np.linspace(m + 1e-4, 0.5, 60):
        b, c, pmf = signoff._trinomial(n, (psi + m) / 2, (psi - m) / 2)
        worst = max(worst, float(pmf[signoff.tango_z(m, b, c, n) <= -z].sum()))
    assert worst > 0.055


def test_min_questions():
    for m in (0.01, 0.02, 0.05):
        k = min_questions(m, 0.05)
        assert signoff.ni_test(0, 0, k, m, 0.05)[0] and not signoff.ni_test(0, 0, k - 1, m, 0.05)[0]
        assert (1 - m) ** k <= 0.05  # the exact necessary condition
    assert min_questions(0.01, 0.05) == 299 and min_questions(0.0, 0.05) is None


def test_questions_needed_gives_the_power():
    n = signoff.questions_needed(0.02, 0.05, 0.80, 0.05)
    power = signoff.pass_probability(n, 0.025, 0.025, 0.02, 0.05)["pass"]
    assert power == pytest.approx(0.80, abs=0.04)
    assert signoff.questions_needed(0.01, 0.05, 0.8, 0.0) == min_questions(0.01, 0.05)
    assert signoff.questions_needed(0.01, 0.05, 0.8, 0.05, true_drop=0.01) is None
    with pytest.raises(ValueError):
        signoff.questions_needed(0.01, discordance=0.01, true_drop=0.02)


def test_excess_over_the_aa_pair():
    r = signoff.excess_over_aa(40, 1319, 15, 1319)
    assert r["p"] == pytest.approx(stats.fisher_exact([[40, 1279], [15, 1304]], alternative="greater").pvalue)
    assert r["flagged"] and r["ab_rate"] == pytest.approx(40 / 1319)
    assert not signoff.excess_over_aa(16, 1319, 15, 1319)["flagged"]
    # flips both ways cancel in McNemar, not here
    a, b = paired(1319, both=600, a_only=20, b_only=20)
    aa_a, aa_b = paired(1319, both=600, a_only=2, b_only=2)
    ab, aa = compare(a, b), compare(aa_a, aa_b)
    assert ab["mcnemar_p"] == 1.0
    chk = signoff.aa_check(ab, aa)
    assert chk["discordant"]["flagged"] and chk["discordant"]["ab"] == 40 and chk["discordant"]["aa"] == 4
    assert set(chk) == {"discordant", "text_differ"}
    with pytest.raises(ValueError):
        signoff.excess_over_aa(5, 3, 0, 3)


def test_compare_keeps_its_keys_and_adds_the_new_ones():
    a, b = paired(300, both=100, a_only=2, b_only=1)
    r = compare(a, b)
    assert {
        "n",
        "a",
        "b",
        "table",
        "discordant",
        "change",
        "change_ci_low",
        "change_ci_high",
        "mcnemar_p",
        "text_differ",
        "extracted_differ",
        "alpha",
        "max_accuracy_drop",
        "interval",
        "verdict",
        "reasons",
        "drop_upper",
        "drop_lower",
        "method",
    } <= set(r)
    assert "Tango" in r["method"] and r["questions_needed"] >= r["min_questions"]
