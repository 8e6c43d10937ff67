"""Unit tests of e2e.stats on constructed rows; figures checked against scipy where scipy has them."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats as st

from e2e import stats
from e2e.estimate import cell_estimate

L, S = 64, 8


def rows_for(tpt_ms, rounds=8, prefill_s=0.5, noise=0.0, seed=0, invalid=()):
    """Timed rows as measure.py writes them: one long and one short per round."""
    rng = np.random.default_rng(seed)
    out = []
    for r in range(rounds):
        for pos, n in enumerate((L, S) if r % 2 == 0 else (S, L)):
            t = prefill_s + n * tpt_ms / 1e3 + rng.normal(0, noise)
            srv = (n - 1) * tpt_ms / 1e3
            ok = (r, n) not in invalid
            out.append({"n_tokens": n, "round": r, "position": pos, "t_client_s": t, "valid": ok,
                        "invalid_reason": None if ok else "finish_reason 'stop' != 'length'",
                        "server_decode_s": srv, "server_e2e_s": t - 0.001})
    return out


def cs(tpt_ms, **kw):
    return stats.cell_stats(rows_for(tpt_ms, **kw), L, S)


def test_cell_estimate_is_the_differenced_median_of_estimate_py():
    rows = rows_for(30.0, noise=0.01)
    c = stats.cell_stats(rows, L, S)
    assert c.estimate == pytest.approx(cell_estimate(rows, L, S)["decode_ms_per_token"])
    assert c.estimate == pytest.approx(30.0, rel=0.05)
    assert c.ci[0] < c.estimate < c.ci[1]
    assert c.n_rounds == 8 and c.n_invalid == 0


def test_interval_is_reproducible_and_shrinks_with_more_rounds():
    a = cs(30.0, rounds=6, noise=0.02, seed=1)
    b = cs(30.0, rounds=6, noise=0.02, seed=1)
    assert a.ci == b.ci  # fixed seed
    wide = cs(30.0, rounds=6, noise=0.02, seed=2).half_width_rel
    narrow = cs(30.0, rounds=40, noise=0.02, seed=2).half_width_rel
    assert narrow < wide


def test_bootstrap_resamples_whole_rounds():
    long_s, short_s = np.array([1.0, 2.0, 3.0]), np.array([0.5, 1.5, 2.5])
    b = stats.bootstrap_estimates(long_s, short_s, 2, 1, n_boot=500)
    # every round's short is its long minus 0.5 s: resampling whole rounds keeps that pairing, so
    # every replicate is exactly 500 ms/token (resampling the columns apart would scatter them)
    assert set(np.round(b, 6)) == {500.0}


def test_too_few_rounds_gives_no_interval_and_a_warning():
    c = cs(30.0, rounds=3, noise=0.01)
    assert c.estimate is not None and c.ci is None and c.half_width_rel is None
    assert any("no interval" in w for w in c.warnings)


def test_too_few_valid_rows_and_invalid_rows_are_warned():
    c = cs(30.0, rounds=3, invalid={(0, L), (1, L)})
    assert c.n_valid_long == 1 and c.n_invalid == 2
    assert any("too few valid rows" in w for w in c.warnings)
    assert any("2 invalid row(s)" in w for w in c.warnings)


def test_no_valid_rows_at_all():
    c = stats.cell_stats([], L, S)
    assert c.estimate is None and c.ci is None and c.n_rounds == 0


def test_spread_outlier_and_disagreement_warnings():
    rows = rows_for(30.0, rounds=10, noise=0.001)
    for r in rows:
        if r["round"] == 4 and r["n_tokens"] == L:
            r["t_client_s"] += 1.0          # one slow long request
    c = stats.cell_stats(rows, L, S)
    assert 4 in c.outlier_rounds
    assert any("outlier" in w for w in c.warnings)
    assert any("spread too wide" in w for w in c.warnings)
    for r in rows:
        r["server_decode_s"] *= 0.5         # server says half of what the client sees
    c = stats.cell_stats(rows, L, S)
    assert c.disagreement == pytest.approx(1.0, rel=0.1)
    assert any("disagree" in w for w in c.warnings)


def test_quiet_cell_has_no_warnings():
    c = cs(30.0, rounds=10, noise=0.002)
    assert c.warnings == [] and c.cv < stats.CV_WARN
    assert c.server_estimate == pytest.approx(30.0)


def test_cv_matches_numpy_on_per_round_values():
    c = cs(30.0, rounds=10, noise=0.01, seed=3)
    x = np.array(c.per_round)
    assert c.cv == pytest.approx(np.std(x, ddof=1) / np.mean(x))


def test_robust_outliers_needs_scale():
    assert stats.robust_outliers(np.array([1.0, 1.0, 1.0, 1.0, 9.0])).size == 0  # MAD 0
    assert stats.robust_outliers(np.array([1.0, 9.0, 1.1])).size == 0            # too few
    assert list(stats.robust_outliers(np.array([1.0, 1.1, 0.9, 1.05, 0.95, 5.0]))) == [5]


def test_mann_whitney_matches_scipy_and_refuses_unreachable():
    a, b = [1, 2, 3, 4, 5, 6], [4, 5, 6, 7, 8, 9.5]
    assert stats.mann_whitney_p(a, b, 0.05) == pytest.approx(
        st.mannwhitneyu(a, b, alternative="two-sided").pvalue)
    assert stats.mann_whitney_p([1, 2], [3, 4], 0.05) is None  # min p = 1/3
    assert stats.mann_whitney_p([], [3, 4], 0.05) is None


@pytest.mark.parametrize("ratio,ci,p,expected", [
    (1.10, (1.05, 1.15), 0.001, stats.SLOWER),
    (0.90, (0.85, 0.95), 0.001, stats.FASTER),
    (1.01, (1.005, 1.015), 1e-6, stats.SAME),      # significant but below the 2 % minimum effect
    (1.10, (0.98, 1.22), 0.10, stats.SAME),        # interval includes 1
    (1.10, (1.01, 1.20), 0.20, stats.SAME),        # test says no
    (1.10, (1.01, 1.20), None, stats.SLOWER),      # test unreachable: interval decides
    (None, None, None, stats.NODATA),
    (1.10, None, 0.01, stats.NODATA),
])
def test_decide(ratio, ci, p, expected):
    assert stats.decide(ratio, ci, p, 0.05, 2.0) == expected


def test_min_effect_is_configurable():
    assert stats.decide(1.05, (1.03, 1.07), 0.001, 0.05, 10.0) == stats.SAME
    assert stats.decide(1.05, (1.03, 1.07), 0.001, 0.05, 2.0) == stats.SLOWER


def test_pooled_ratio_matches_scipy_welch_on_log_estimates():
    # between-server spread much larger than within-cell noise: the floor does not bind
    ref = [cs(t, rounds=10, noise=0.0005, seed=i) for i, t in enumerate((30.0, 31.5, 29.0))]
    arm = [cs(t, rounds=10, noise=0.0005, seed=9 + i) for i, t in enumerate((36.0, 33.0, 35.0))]
    res = stats.pooled_ratio(ref, arm, 0.05, 2.0)
    la, lr = np.log([c.estimate for c in arm]), np.log([c.estimate for c in ref])
    tt = st.ttest_ind(la, lr, equal_var=False)
    assert res.p == pytest.approx(tt.pvalue, rel=1e-9)
    lo, hi = tt.confidence_interval(0.95)
    assert res.ci[0] == pytest.approx(math.exp(lo), rel=1e-9)
    assert res.ci[1] == pytest.approx(math.exp(hi), rel=1e-9)
    assert res.ratio == pytest.approx(math.exp(la.mean() - lr.mean()))
    assert res.decision == stats.SLOWER


def test_pooled_ratio_floor_keeps_two_agreeing_servers_honest():
    # two passes that agree by chance: the within-cell noise still sets the interval
    ref = [cs(30.0, rounds=10, noise=0.05, seed=1), cs(30.0, rounds=10, noise=0.05, seed=1)]
    arm = [cs(30.3, rounds=10, noise=0.05, seed=2), cs(30.3, rounds=10, noise=0.05, seed=2)]
    res = stats.pooled_ratio(ref, arm, 0.05, 2.0)
    assert res.ci[1] - res.ci[0] > 0.01 and res.decision == stats.SAME


def test_pooled_ratio_one_pass_warns_and_uses_within_variance():
    res = stats.pooled_ratio([cs(30.0, noise=0.002)], [cs(36.0, noise=0.002, seed=4)], 0.05, 2.0)
    assert "normal" in res.test and any("between-server" in w for w in res.warnings)
    assert res.decision == stats.SLOWER and res.diff_ms == pytest.approx(6.0, rel=0.1)


def test_pooled_ratio_missing_or_failed_cells():
    assert stats.pooled_ratio([], [cs(30.0)], 0.05, 2.0).decision == stats.NODATA
    dead = stats.cell_stats([], L, S)
    assert stats.pooled_ratio([dead], [cs(30.0)], 0.05, 2.0).decision == stats.NODATA
    few = cs(30.0, rounds=3)  # no interval, one cell each: nothing to compare with
    assert stats.pooled_ratio([few], [cs(33.0, rounds=3)], 0.05, 2.0).decision == stats.NODATA


def test_within_server_ratio():
    ref, same, slow = cs(30.0, noise=0.003, seed=1), cs(30.0, noise=0.003, seed=2), cs(36.0, noise=0.003, seed=3)
    r = stats.within_server_ratio(ref, slow, 0.05, 2.0)
    assert r.decision == stats.SLOWER and r.ci[0] > 1 and r.p < 0.05
    assert r.diff_ci[0] < r.diff_ms < r.diff_ci[1]
    assert stats.within_server_ratio(ref, same, 0.05, 2.0).decision == stats.SAME
    few = stats.within_server_ratio(cs(30.0, rounds=3), cs(36.0, rounds=3), 0.05, 2.0)
    assert few.decision == stats.NODATA and few.ratio == pytest.approx(1.2, rel=0.05)


def test_pooled_estimate_matches_scipy_t_interval():
    cells = [cs(t, rounds=10, noise=0.0005, seed=i) for i, t in enumerate((30.0, 32.0, 31.0))]
    pe = stats.pooled_estimate(cells)
    logs = np.log([c.estimate for c in cells])
    lo, hi = st.t.interval(0.95, len(logs) - 1, loc=logs.mean(), scale=st.sem(logs))
    assert pe["ci_lo_ms"] == pytest.approx(math.exp(lo)) and pe["ci_hi_ms"] == pytest.approx(math.exp(hi))
    one = stats.pooled_estimate(cells[:1])
    assert one["n_cells"] == 1 and (one["ci_lo_ms"], one["ci_hi_ms"]) == cells[0].ci
    assert stats.pooled_estimate([])["estimate_ms"] is None


def test_pass_agreement():
    assert stats.pass_agreement({1: cs(30.0)})["max_rel_diff_pct"] is None  # one pass
    close = stats.pass_agreement({1: cs(30.0, noise=0.02, seed=1), 2: cs(30.3, noise=0.02, seed=2)})
    assert close["max_rel_diff_pct"] < 3 and not close["flagged"]
    far = stats.pass_agreement({1: cs(30.0, noise=0.001), 2: cs(33.0, noise=0.001, seed=5)})
    assert far["max_rel_diff_pct"] == pytest.approx(10, abs=0.5) and far["flagged"]
    assert far["passes"] == [1, 2]


def _cfg(pct):
    return SimpleNamespace(workload=SimpleNamespace(target_ci_pct=pct, long_tokens=L, short_tokens=S))


def test_target_ci_stop_rule():
    assert stats.target_ci_stop_rule(_cfg(None)) is None
    rule = stats.target_ci_stop_rule(_cfg(2.0))
    assert rule(rows_for(30.0, rounds=4, noise=0.0001)) is False      # no interval yet
    assert rule(rows_for(30.0, rounds=6, noise=0.0001)) is True       # tight
    assert rule(rows_for(30.0, rounds=6, noise=0.05, seed=3)) is False  # noisy
    # rows without 'round' (pairs in arrival order) work too
    bare = [{k: v for k, v in r.items() if k != "round"} for r in rows_for(30.0, rounds=6, noise=0.0001)]
    assert rule(bare) is True
