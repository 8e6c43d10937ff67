"""e2e.stats.verdicts and e2e.stats.changepoints on constructed cells: figures checked against scipy (t tests,
noncentral t) and against hand values. Rates over many simulated runs: tests/unit/validation/test_conformance.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from e2e.errors import UserError
from e2e.stats import cells as stats
from e2e.stats import changepoints as cp
from e2e.stats import one_arm
from e2e.stats import verdicts as v
from tests.support.synthetic import L, S, cs


def cells(*tpts, noise=0.0005, seed=0, rounds=10):
    return [cs(t, rounds=rounds, noise=noise, seed=seed + i) for i, t in enumerate(tpts)]


def logs(cc):
    return np.log([c.estimate for c in cc])


# -- the pooled comparison ------------------------------------------------------------------------
def quiet(*tpts):
    """Cells with no noise of their own (log estimates): their variance is all between servers."""
    return [cp._as_cell(math.log(t)) for t in tpts]


def test_without_cell_noise_the_model_is_the_pooled_t_test():
    # each cell its own server and no within-cell noise: REML's variance is the pooled sample
    # variance and Satterthwaite's df is k_ref + k_arm - 2, exactly the pooled two-sample t
    ref, arm = quiet(30.0, 31.5, 29.0), quiet(36.0, 33.0, 35.0, 34.0)
    c = v.pooled_comparison(ref, arm, 0.05, 2.0)
    la, lr = logs(arm), logs(ref)
    tt = st.ttest_ind(la, lr, equal_var=True)
    assert c.df == pytest.approx(5, rel=1e-6) and c.ci_kind == v.BETWEEN
    assert c.p == pytest.approx(tt.pvalue, rel=1e-5)
    lo, hi = tt.confidence_interval(0.95)
    assert c.ci == pytest.approx((math.exp(lo), math.exp(hi)), rel=1e-5)
    assert c.ratio == pytest.approx(math.exp(la.mean() - lr.mean()))
    assert c.n_ref == 3 and c.n_arm == 4 and c.decision == v.SLOWER
    assert c.diff_ci[0] < c.diff_ms < c.diff_ci[1]


def test_tost_is_the_larger_of_two_one_sided_t_tests():
    ref, arm = quiet(30.0, 30.3, 29.8, 30.1), quiet(30.2, 30.0, 30.4, 29.9)
    c = v.pooled_comparison(ref, arm, 0.05, 5.0)
    la, lr, m = logs(arm), logs(ref), math.log(1.05)
    lower = st.ttest_ind(la + m, lr, alternative="greater").pvalue
    upper = st.ttest_ind(la - m, lr, alternative="less").pvalue
    assert c.p_equiv == pytest.approx(max(lower, upper), rel=1e-5)
    lo, hi = st.ttest_ind(la, lr).confidence_interval(0.90)
    assert c.p_equiv < 0.05 and -m < lo and hi < m
    assert c.decision == v.EQUIVALENT
    assert v.pooled_comparison(ref, arm, 0.05, 0.0).p_equiv is None  # no margin, no equivalence


def test_two_agreeing_servers_cannot_beat_their_own_noise():
    # two servers per arm that agree by chance: the cells' own noise still sets the interval
    ref = [cs(30.0, rounds=10, noise=0.05, seed=1)] * 2
    arm = [cs(30.3, rounds=10, noise=0.05, seed=2)] * 2
    c = v.pooled_comparison(ref, arm, 0.05, 2.0)
    own = math.sqrt(np.mean([x.robust_log_var for x in ref + arm]))
    assert c.se_log >= 0.9 * own * math.sqrt(1 / 2 + 1 / 2)
    assert c.decision == v.INCONCLUSIVE and c.ci[1] - c.ci[0] > 0.05


@pytest.mark.parametrize("k_ref,k_arm", [(1, 1), (1, 3), (4, 1)])
def test_one_server_in_an_arm_decides_nothing(k_ref, k_arm):
    ref = cells(*[30.0] * k_ref, noise=0.002)
    arm = cells(*[36.0] * k_arm, noise=0.002, seed=4)
    c = v.pooled_comparison(ref, arm, 0.05, 2.0)
    assert c.decision == v.INSUFFICIENT_REPLICATION and c.ci_kind == v.WITHIN
    assert c.p is None and c.p_equiv is None and c.mde_pct is None and c.df is None
    assert c.ratio == pytest.approx(1.2, rel=0.02) and c.ci[0] < c.ratio < c.ci[1]
    assert any("at least 2 per arm" in w for w in c.warnings)
    v.decide_family([c], 0.05)
    assert c.decision == v.INSUFFICIENT_REPLICATION and c.p_adjusted is None


def test_missing_or_failed_cells():
    assert v.pooled_comparison([], cells(30.0, 31.0), 0.05, 2.0).decision == v.NODATA
    dead = stats.cell_stats([], L, S)
    assert v.pooled_comparison([dead, dead], cells(30.0, 31.0), 0.05, 2.0).decision == v.NODATA
    # two servers each but one of them failed: one server left in that arm
    c = v.pooled_comparison([dead, cs(30.0)], cells(30.0, 31.0), 0.05, 2.0)
    assert c.decision == v.INSUFFICIENT_REPLICATION and c.n_ref == 1
    same = quiet(30.0, 30.0)  # identical and noiseless: no variance at all
    c = v.pooled_comparison(same, same, 0.05, 2.0)
    assert c.decision == v.INCONCLUSIVE and c.p is None and any("zero variance" in w for w in c.warnings), c.warnings


@pytest.mark.parametrize(
    "ratio,p,pe,expected",
    [
        (1.10, 0.001, None, v.SLOWER),
        (0.90, 0.001, None, v.FASTER),
        (1.01, 1e-6, 0.001, v.EQUIVALENT),  # significant, below the 2 % minimum, inside the margin
        (1.01, 1e-6, 0.20, v.INCONCLUSIVE),  # significant, below the minimum, not shown equivalent
        (1.02, 0.01, None, v.SLOWER),  # exactly the minimum effect
        (1.10, 0.20, 0.90, v.INCONCLUSIVE),  # no evidence either way: never "no change"
        (1.10, None, None, v.INCONCLUSIVE),
        (None, None, None, v.NODATA),
    ],
)
def test_decide(ratio, p, pe, expected):
    assert v.decide(ratio, p, pe, 0.05, 2.0) == expected


def test_equivalence_needs_a_margin():
    assert v.decide(1.0, 0.9, 0.001, 0.05, 0.0) == v.INCONCLUSIVE


# -- the MDE (planning's; its own tests: test_planning.py) --------------------------------------------
def test_comparison_mde_is_the_rules_at_the_familys_step():
    c = v.pooled_comparison(cells(30.0, 31.5, 29.0), cells(30.5, 29.5, 31.0, seed=9), 0.05, 2.0)
    v.decide_family([c], 0.05)
    from e2e.stats import planning

    assert c.alpha_step == 0.05 and c.mde_pct == pytest.approx(planning.mde_pct(c.se_log, c.df, 0.05, 2.0))
    assert c.mde_pct > 2.0


# -- the family -----------------------------------------------------------------------------------
def test_holm_and_bonferroni_by_hand():
    p = [0.01, 0.04, 0.03, 0.005]
    # sorted 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 -> max(0.06, 0.04) = 0.06
    assert v.adjust(p, "holm") == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert v.adjust(p, "bonferroni") == pytest.approx([0.04, 0.16, 0.12, 0.02])
    assert v.adjust(p, "none") == p and v.adjust([], "holm") == []
    with pytest.raises(UserError, match="unknown multiplicity"):
        v.adjust(p, "fdr")


def test_decide_family_adjusts_and_redecides():
    # one clear slowdown and two marginal ones: Holm keeps the clear one only
    ref = cells(30.0, 31.5, 29.0, 30.5)
    clear = v.pooled_comparison(ref, cells(36.0, 37.0, 35.5, 36.5, seed=20), 0.05, 2.0)
    marg = [
        v.pooled_comparison(ref, cells(*lv, seed=30), 0.05, 2.0)
        for lv in ((32.2, 33.0, 31.0, 32.5), (32.0, 32.9, 30.8, 32.3))
    ]
    # Holm: 3 p_clear, then 2 * 0.029 > 0.05 for the smaller marginal p, and the larger follows it
    assert clear.p < 0.001 and all(0.026 < m.p < 0.05 for m in marg)
    assert all(m.decision == v.SLOWER for m in marg)
    one = v.pooled_comparison([ref[0]], [ref[1]], 0.05, 2.0)  # insufficient: not in the family
    per_pass = v.within_server_ratio(ref[0], ref[1], 0.05, 2.0)  # no decision: not in it either
    line = v.decide_family([clear, *marg, one, per_pass], 0.05)
    assert line.startswith("Holm step-down over 3 comparison(s)")
    assert clear.decision == v.SLOWER
    for m in marg:
        assert m.decision_unadjusted == v.SLOWER and m.decision == v.INCONCLUSIVE
        assert m.p_adjusted == pytest.approx(v.adjust([clear.p, *(x.p for x in marg)])[1 + marg.index(m)])
        assert any(w.startswith("inconclusive: with 4 + 4 servers") for w in m.warnings)
        from e2e.stats import planning

        assert m.mde_pct == pytest.approx(planning.mde_pct(m.se_log, m.df, 0.05 / 3, 2.0))
    assert one.decision == v.INSUFFICIENT_REPLICATION and per_pass.decision is None
    v.decide_family([clear, *marg], 0.05)  # twice: the same answer, warnings not repeated
    assert sum(w.startswith("inconclusive: with") for w in marg[0].warnings) == 1
    assert v.decide_family([one], 0.05).startswith("no comparison")


# -- one arm, one pass ----------------------------------------------------------------------------
def test_pooled_estimate_matches_scipy_t_interval():
    cc = quiet(30.0, 32.0, 31.0)
    pe = one_arm.pooled_estimate(cc)
    x = logs(cc)
    lo, hi = st.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=st.sem(x))
    assert pe["ci_lo_ms"] == pytest.approx(math.exp(lo), rel=1e-5) and pe["ci_hi_ms"] == pytest.approx(
        math.exp(hi), rel=1e-5
    )
    assert pe["ci_kind"] == v.BETWEEN and pe["n_cells"] == 3
    cc = cells(30.0, 32.0, 31.0)
    one = one_arm.pooled_estimate(cc[:1])
    assert one["n_cells"] == 1 and (one["ci_lo_ms"], one["ci_hi_ms"]) == cc[0].ci
    assert one["ci_kind"] == v.WITHIN_ONE
    assert one_arm.pooled_estimate([])["estimate_ms"] is None


def test_within_server_ratio_gives_an_interval_and_no_decision():
    ref, slow = cs(30.0, noise=0.003, seed=1), cs(36.0, noise=0.003, seed=3)
    r = v.within_server_ratio(ref, slow, 0.05, 2.0)
    assert r.decision is None and r.p is None and r.ci_kind == v.WITHIN
    assert r.ci[0] < r.ratio < r.ci[1] and r.ci[0] > 1
    assert r.diff_ci[0] < r.diff_ms < r.diff_ci[1]
    few = v.within_server_ratio(cs(30.0, rounds=3), cs(36.0, rounds=3), 0.05, 2.0)
    assert few.ci is None and few.ratio == pytest.approx(1.2, rel=0.05) and few.decision is None


def test_to_dict_keys():
    d = v.pooled_comparison(cells(30.0, 31.0), cells(33.0, 34.0, seed=5), 0.05, 2.0).to_dict()
    assert {
        "ratio",
        "ratio_ci_lo",
        "ratio_ci_hi",
        "ci_kind",
        "p_value",
        "p_adjusted",
        "p_equiv",
        "p_equiv_adjusted",
        "df",
        "se_log",
        "n_ref",
        "n_arm",
        "mde_pct",
        "alpha_step",
        "servers_needed",
        "model",
        "decision",
        "decision_unadjusted",
        "diff_ms",
        "diff_ci_lo_ms",
        "diff_ci_hi_ms",
        "warnings",
    } <= set(d)


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.2])
def test_bad_alpha_is_a_user_error(alpha):
    with pytest.raises(UserError, match="alpha"):
        v.pooled_comparison(cells(30.0, 31.0), cells(30.0, 31.0), alpha, 2.0)
    with pytest.raises(UserError, match="alpha"):
        v.decide_family([], alpha)


# -- change points (rates over many series: tests/unit/validation/test_conformance.py) ----------------------------------
def _series(levels, k=4, spread=0.02, seed=0):
    rng = np.random.default_rng(seed)
    return [list(np.log(lv) + rng.normal(0, spread, k)) for lv in levels]


def test_change_point_found_with_its_runs_and_ratio():
    runs = _series([10.0] * 4 + [11.0] * 4, seed=1)
    out = cp.find_change_points(runs, 0.05, 2.0, labels=[f"v{i}" for i in range(8)])
    assert len(out) == 1
    c = out[0]
    assert c.index == 4 and c.runs_before == ["v0", "v1", "v2", "v3"] and c.runs_after == ["v4", "v5", "v6", "v7"]
    xb, xa = np.concatenate(runs[:4]), np.concatenate(runs[4:])
    assert c.ratio == pytest.approx(math.exp(xa.mean() - xb.mean()))
    assert c.p_adjusted == pytest.approx(min(1, 7 * c.p)) and c.decision == v.SLOWER
    assert c.ci[0] < c.ratio < c.ci[1] and c.run_variance == "estimated"
    assert c.to_dict()["n_before"] == 16


def test_runs_are_not_exchangeable_servers():
    """Four runs a side, each run's servers shifted together by 1.5 % (another day, the same vLLM):
    pooling servers as exchangeable (the old model) calls a 3 % step between the sides; the run
    factor sees that the runs themselves scatter that much and does not."""
    rng = np.random.default_rng(4)
    shifts = [0.0, 0.025, -0.02, 0.01, 0.035, 0.055, 0.02, 0.045]  # runs 4-7: +3 % on average
    runs = [list(math.log(10.0) + s + rng.normal(0, 0.002, 4)) for s in shifts]
    pooled = v.pooled_comparison(
        quiet(*np.exp(np.concatenate(runs[:4]))), quiet(*np.exp(np.concatenate(runs[4:]))), 0.05, 2.0
    )
    assert pooled.p < 1e-6 and pooled.decision == v.SLOWER  # servers as replicates: "slower"
    cmp, how = cp._Series(runs, 0.05, 2.0, 0.95, 1).test(0, 4, 8)
    assert how == "estimated" and cmp.p > 0.01 and cmp.df < 10  # runs as replicates: no step
    assert cp.find_change_points(runs, 0.05, 2.0) == []


def test_two_steps_and_a_flat_series():
    out = cp.find_change_points(_series([10.0] * 4 + [12.0] * 4 + [13.5] * 4, seed=1), 0.05, 2.0)
    assert [(c.index, c.decision) for c in out] == [(4, v.SLOWER), (8, v.SLOWER)]
    assert cp.find_change_points(_series([10.0] * 8, seed=2), 0.05, 2.0) == []
    # the family: the same series tested as one of 50 needs a stronger step
    weak = _series([10.0] * 4 + [10.2] * 4, spread=0.01, seed=3)
    assert cp.find_change_points(weak, 0.05, 2.0, n_series=1) and not cp.find_change_points(
        weak, 0.05, 2.0, n_series=50
    )


def test_change_points_on_cells_and_single_server_runs():
    # one server per run: runs pool into segments, so a step is still found
    runs = [[cs(t, rounds=10, noise=0.002, seed=i)] for i, t in enumerate([30.0] * 4 + [36.0] * 4)]
    out = cp.find_change_points(runs, 0.05, 2.0)
    assert [(c.index, c.decision) for c in out] == [(4, v.SLOWER)]
    assert cp.find_change_points(runs[:1], 0.05, 2.0) == []  # nothing to split


def test_change_points_bad_input():
    with pytest.raises(UserError, match="labels"):
        cp.find_change_points(_series([10.0] * 3), labels=["a"])
    with pytest.raises(UserError, match="not a CellStats"):
        cp.find_change_points([["x", 1.0], [1.0, 2.0]])
