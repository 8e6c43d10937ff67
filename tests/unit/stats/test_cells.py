"""Unit tests of e2e.stats.cells (per-cell statistics) on constructed rows. Between-arm tests: test_verdicts.py."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from e2e.stats import bootstrap
from e2e.stats import cells as stats
from e2e.stats.estimate import cell_estimate
from tests.support.synthetic import L, S, cs, rows_for


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
    b = bootstrap.bootstrap_estimates(long_s, short_s, 2, 1, seed=stats.SEED, n_boot=500)
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
            r["t_client_s"] += 1.0  # one slow long request
    c = stats.cell_stats(rows, L, S)
    assert 4 in c.outlier_rounds
    assert any("outlier" in w for w in c.warnings)
    assert any("spread too wide" in w for w in c.warnings)
    for r in rows:
        r["server_decode_s"] *= 0.5  # server says half of what the client sees
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
    assert stats.robust_outliers(np.array([1.0, 9.0, 1.1])).size == 0  # too few
    assert list(stats.robust_outliers(np.array([1.0, 1.1, 0.9, 1.05, 0.95, 5.0]))) == [5]


def test_bootstrap_median_shortcut_equals_nanmedian():
    # without NaNs bootstrap_estimates sorts instead of calling np.nanmedian: same replicates
    rng = np.random.default_rng(5)
    long_s, short_s = 0.7 + rng.normal(0, 0.02, 9), 0.1 + rng.normal(0, 0.01, 9)
    b = bootstrap.bootstrap_estimates(long_s, short_s, L, S, n_boot=300, seed=3)
    idx = np.random.default_rng(3).integers(0, 9, size=(300, 9))
    ref = (np.nanmedian(long_s[idx], axis=1) - np.nanmedian(short_s[idx], axis=1)) / (L - S) * 1e3
    assert np.array_equal(b, ref)
    for k in (4, 5):  # odd and even row lengths
        x = rng.random((50, k))
        assert np.array_equal(bootstrap.row_median(x), np.median(x, axis=1))


def test_log_se_is_the_sd_of_the_log_bootstrap():
    c = cs(30.0, rounds=10, noise=0.01, seed=4)
    assert c.log_se == pytest.approx(np.std(np.log(c.boot), ddof=1))
    assert cs(30.0, rounds=3).log_se is None  # no interval, no se


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
    assert rule(rows_for(30.0, rounds=4, noise=0.0001)) is False  # no interval yet
    assert rule(rows_for(30.0, rounds=6, noise=0.0001)) is True  # tight
    assert rule(rows_for(30.0, rounds=6, noise=0.05, seed=3)) is False  # noisy
    # rows without 'round' (pairs in arrival order) work too
    bare = [{k: v for k, v in r.items() if k != "round"} for r in rows_for(30.0, rounds=6, noise=0.0001)]
    assert rule(bare) is True


def test_target_ci_stop_rule_judges_the_estimator_that_decides():
    # a jittery prefill the server reports: the client's interval is wide, the corrected one narrow
    rows = rows_with_prefill(30.0, rounds=8, prefill_sd=0.02, decode_sd=0.0002, seed=4)
    cfg = SimpleNamespace(workload=_cfg(1.0).workload, stats=SimpleNamespace(estimator="auto"))
    assert stats.cell_stats(rows, L, S).half_width_rel * 100 > 1.0
    assert stats.target_ci_stop_rule(cfg)(rows) is True
    # stats.estimator = "client", or a row without the server's prefill time: the client's width
    client = SimpleNamespace(workload=cfg.workload, stats=SimpleNamespace(estimator="client"))
    assert stats.target_ci_stop_rule(client)(rows) is False
    gap = [dict(r, server_prefill_s=None) if i == 3 else r for i, r in enumerate(rows)]
    assert stats.target_ci_stop_rule(cfg)(gap) is False


# -- the estimator and the robust noise (issue 21) --------------------------------------------------
def rows_with_prefill(tpt_ms, rounds=8, prefill_sd=0.02, decode_sd=0.0005, seed=0, gap_s=0.0):
    """Rows whose client time carries a jittery prefill that the server reports (server_prefill_s);
    gap_s adds to the prefill the server reports for the 64-token requests only (a prefill time that
    is not the request's own: queueing counted as prefill, a metric delta that caught another request)."""
    rng = np.random.default_rng(seed)
    out = []
    for r in range(rounds):
        for pos, n in enumerate((L, S) if r % 2 == 0 else (S, L)):
            pre = 2.7 + rng.normal(0, prefill_sd)
            t = pre + n * tpt_ms / 1e3 + rng.normal(0, decode_sd)
            out.append(
                {
                    "n_tokens": n,
                    "round": r,
                    "position": pos,
                    "t_client_s": t,
                    "valid": True,
                    "server_prefill_s": pre + (gap_s if n == L else 0.0),
                    "server_decode_s": (n - 1) * tpt_ms / 1e3,
                }
            )
    return out


def test_the_corrected_estimator_removes_the_prefill_jitter_and_keeps_the_definition():
    rows = rows_with_prefill(11.4, prefill_sd=0.008, seed=3)
    plain = stats.cell_stats(rows, L, S)
    corr = stats.cell_stats(rows, L, S, estimator="prefill-corrected")
    assert corr.estimator == "prefill-corrected" and corr.client_estimate == pytest.approx(plain.estimate)
    assert corr.estimate == pytest.approx(11.4, rel=0.002)
    assert corr.half_width_rel < plain.half_width_rel / 3  # the jitter was most of the noise
    assert corr.client_agrees is True and corr.client_gap_sd is not None
    assert plain.client_agrees is None  # nothing to check for the plain one


def test_a_prefill_time_that_is_not_the_requests_own_is_flagged():
    # the server reports 30 ms more prefill on every long request: the corrected estimate falls by
    # 0.54 ms/token, the plain client one does not
    corr = stats.cell_stats(rows_with_prefill(11.4, prefill_sd=0.001, gap_s=0.03), L, S, estimator="prefill-corrected")
    assert corr.client_agrees is False
    assert corr.client_gap == pytest.approx(0.03 / 56 * 1e3 / corr.estimate, rel=0.05)
    assert any(w.startswith("estimator check") for w in corr.warnings)


def test_a_missing_prefill_time_drops_its_request_not_the_corrected_value():
    rows = rows_with_prefill(11.4)
    rows[3]["server_prefill_s"] = None
    from e2e.stats.estimate import estimator_ms

    whole = estimator_ms(rows_with_prefill(11.4), L, S, "prefill-corrected")
    assert estimator_ms(rows, L, S, "prefill-corrected") == pytest.approx(whole, rel=0.01)
    assert estimator_ms(rows, L, S, "client") is not None
    cs = stats.cell_stats(rows, L, S, estimator="prefill-corrected")  # the round stays, aligned with the client's
    assert cs.n_valid_long + cs.n_valid_short == len(rows) - 1 and cs.client_agrees is True


@pytest.mark.parametrize("n", [3, 6, 10, 30])
def test_median_variance_factor_by_an_independent_simulation(n):
    """k * (MAD sd)^2 estimates the variance of a median of n normal values (tolerance 4 %:
    20,000 samples here, each a Monte-Carlo error of ~1-2 %; 200,000 in the function)."""
    k, df = stats.median_variance_factor(n)
    x = np.random.default_rng(99).standard_normal((20_000, n)) * 3.0
    med = np.median(x, axis=1)
    s2 = np.array([stats.robust_scale(r) for r in x]) ** 2
    assert k * s2.mean() == pytest.approx(med.var(), rel=0.04)
    assert 0.3 * (n - 1) < df < 0.6 * (n - 1) + 1
    assert stats.median_variance_factor(10_000)[0] == pytest.approx(np.pi / 20_000)


def test_one_late_request_leaves_the_robust_noise_alone():
    """The variance floor's defect: one +0.5 s request made a 6-round cell's bootstrap 10-50x wider.
    The robust noise that the model uses moves by far less."""
    rows = rows_for(11.0, rounds=6, noise=0.0008, seed=5)
    clean = stats.cell_stats(rows, L, S)
    rows[4]["t_client_s"] += 0.5
    late = stats.cell_stats(rows, L, S)
    assert late.log_se > 5 * clean.log_se
    assert late.robust_log_var < 3 * clean.robust_log_var
