"""Conformance of the decision layer by simulation (e2e/conformance.py): known truth in, verdicts out,
through the functions a run uses. Fixed seeds: deterministic. Tolerances: a rate meant to be at most
5 % may reach 5 % + 3 Monte-Carlo standard errors (conformance.tol); coverage must be >= 93 % for a
95 % interval. `python -m e2e.conformance` prints the same figures for the README."""
from __future__ import annotations

import math

import numpy as np
import pytest

from e2e import conformance as cf
from e2e import signoff, stats
from e2e import verdicts as v

N = 500     # experiments per design


@pytest.fixture(scope="module")
def figs() -> dict[str, cf.Figure]:
    return {f.key: f for f in cf.run(N)}


def _tol(f: cf.Figure, p: float = 0.05) -> float:
    return p + cf.tol(p, f.n)


# -- the simulation itself ------------------------------------------------------------------------
def test_cell_stats_is_scale_equivariant_so_offsets_can_scale_cells():
    rows = cf.cell_rows(np.random.default_rng(1))
    c = stats.cell_stats(rows, cf.LONG, cf.SHORT)
    f = 1.137
    slow = stats.cell_stats([{**r, "t_client_s": r["t_client_s"] * f} for r in rows], cf.LONG, cf.SHORT)
    s = cf.scaled(c, f)
    assert s.estimate == pytest.approx(slow.estimate, rel=1e-12)
    assert s.ci == pytest.approx(slow.ci, rel=1e-12)
    assert np.allclose(s.boot, slow.boot, rtol=1e-12) and s.log_se == pytest.approx(slow.log_se, rel=1e-9)


def test_simulated_cells_measure_the_per_token_cost():
    pool = cf.Sim(pool=60).pool(0.0)
    est = np.array([c.estimate for c in pool])
    assert np.median(est) == pytest.approx(cf.TPT_MS, rel=0.01)
    assert 0.005 < np.std(np.log(est)) < 0.03          # 2-5 % request noise, 10 rounds: ~1-2 % per cell


def test_vectorised_mcnemar_is_mcnemar_exact():
    b, c = np.array([0, 1, 9, 3, 5, 0, 7, 40]), np.array([0, 9, 1, 1, 5, 5, 30, 35])
    assert cf.mcnemar_p(b, c) == pytest.approx([signoff.mcnemar_exact(int(x), int(y)) for x, y in zip(b, c)])


# -- between arms ---------------------------------------------------------------------------------
@pytest.mark.parametrize("spread", [5, 20])
def test_one_server_per_arm_is_always_insufficient_replication(figs, spread):
    assert figs[f"aa_insufficient_k1_s{spread}"].value == 1.0


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("spread", [5, 20])
def test_aa_false_decisions_and_coverage(figs, k, spread):
    f = figs[f"aa_decided_k{k}_s{spread}"]
    assert f.n == N and f.value <= _tol(f)
    assert figs[f"aa_coverage_k{k}_s{spread}"].value >= 0.93


def test_mde_shrinks_with_servers_and_grows_with_spread(figs):
    m = {key: figs[f"aa_mde_{key}"].value for key in ("k2_s5", "k4_s5", "k2_s20", "k4_s20")}
    assert m["k4_s5"] < m["k2_s5"] and m["k4_s20"] < m["k2_s20"] and m["k2_s5"] < m["k2_s20"]


def test_ten_percent_slowdown_with_eight_servers_is_found(figs):
    assert figs["slow10_k8_s5"].value >= 0.80


def test_reported_mde_matches_the_simulated_power(figs):
    # at the MDE of the design's true se the test rejects 80 % of the time (3 MC se + 2 points)
    f = figs["mde_power_true_se"]
    assert abs(f.value - 0.80) <= cf.tol(0.8, f.n) + 0.02
    # at the median reported MDE, a little less: the median sample sd is below the true sd
    assert 0.65 <= figs["mde_power_median"].value <= 0.90


def test_equivalence_at_the_margin_is_rarely_claimed(figs):
    f = figs["tost_size_k8"]
    assert f.value <= _tol(f)
    assert figs["tost_power_k8"].value >= 0.80       # and an A/A with enough servers is shown equivalent


def test_holm_controls_the_family(figs):
    f = figs["family_holm"]
    assert f.value <= _tol(f)
    assert figs["family_raw"].value > 0.12            # what the correction is for (~1 - 0.95^6)


# -- change points --------------------------------------------------------------------------------
def test_flat_series_rarely_yields_a_change_point(figs):
    f = figs["cp_flat"]
    assert f.value <= _tol(f)


def test_a_ten_percent_step_is_found(figs):
    assert figs["cp_step_found"].value >= 0.90
    assert figs["cp_step_exact"].value >= 0.75
    assert figs["cp_step_extra"].value <= _tol(figs["cp_step_extra"])


# -- gsm8k ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_q", [1319, 100, 10])
@pytest.mark.parametrize("drop", ["m", "m15"])
def test_a_drop_at_or_beyond_the_margin_rarely_passes(figs, n_q, drop):
    f = figs[f"ni_{n_q}_{drop}"]
    assert f.value <= _tol(f)
    assert figs[f"ni_{n_q}_{drop}_old"].value > 0.15   # the old rule passed these often


@pytest.mark.parametrize("n_q", [10, 100, 1319])
def test_exact_size(figs, n_q):
    assert figs[f"ni_exact_{n_q}"].value <= 0.05


@pytest.mark.parametrize("psi", [2, 5])
def test_aa_rarely_fails(figs, psi):
    f = figs[f"aa_fail_{psi}"]
    assert f.value <= _tol(f)


def test_questions_needed_gives_the_simulated_power(figs):
    f = figs["ni_needed_power"]
    assert abs(f.value - 0.80) <= cf.tol(0.8, f.n) + 0.03
    assert figs["aa_pass_5"].value < figs["aa_pass_2"].value     # more discordance, less power


# -- the printed table ----------------------------------------------------------------------------
def test_markdown_table_and_cli_arguments(figs):
    md = cf.markdown(list(figs.values()))
    lines = md.splitlines()
    assert lines[0].startswith("| figure | design |") and len(lines) == 2 + len(figs)
    assert "**no**" not in md
    f = figs["aa_decided_k4_s20"]
    lo, hi = f.interval
    assert lo <= f.value <= hi and f"(n {N})" in md
    with pytest.raises(SystemExit):
        cf.main(["--experiments", "3"])


def test_every_design_meets_its_target(figs):
    missed = [f"{f.key}: {f.value:.3f} ({f.target})" for f in figs.values() if f.ok is False]
    assert missed == []


def test_rates_are_reproducible():
    a = cf.Sim(seed=3, pool=40)
    b = cf.Sim(seed=3, pool=40)
    ra = [a.comparison(0.0, 2, 0.05).p for _ in range(5)]
    rb = [b.comparison(0.0, 2, 0.05).p for _ in range(5)]
    assert ra == rb and all(math.isfinite(p) for p in ra)
    assert isinstance(a.comparison(0.0, 2, 0.05), v.Comparison)
