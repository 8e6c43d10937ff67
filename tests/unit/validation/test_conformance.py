"""Conformance of the decision layer by simulation (e2e/validation/conformance.py, the simulated runs of
e2e/validation/simulation.py): known truth in, verdicts out, through the functions a run uses. Fixed
seeds: deterministic. Tolerances: a rate meant to be at most 5 % may reach 5 % + 3 Monte-Carlo
standard errors (conformance.tol); coverage must be >= 93 % for a 95 % interval.
`python -m e2e.validation.conformance` prints the same figures for docs/statistics/conformance.md."""

from __future__ import annotations

import math

import numpy as np
import pytest

from e2e.stats import cells as stats
from e2e.stats import signoff
from e2e.validation import conformance as cf
from e2e.validation import conformance_figures
from e2e.validation import simulation as sim_

N = 100  # experiments per design (docs/statistics/conformance.md's table: 2000, `python -m e2e.validation.conformance`)


@pytest.fixture(scope="module")
def figs() -> dict[str, cf.Figure]:
    return {f.key: f for f in cf.run(N, grid=False)}  # the grid rows: tests/unit/validation/test_conformance_grid.py


def _tol(f: cf.Figure, p: float = 0.05) -> float:
    return p + cf.tol(p, f.n)


# -- the simulation itself ------------------------------------------------------------------------
def test_cell_stats_is_scale_equivariant_so_offsets_can_scale_cells():
    rows = sim_.cell_rows(np.random.default_rng(1), 11.0, 0.01)
    c = stats.cell_stats(rows, sim_.LONG, sim_.SHORT)
    f = 1.137
    slow = stats.cell_stats([{**r, "t_client_s": r["t_client_s"] * f} for r in rows], sim_.LONG, sim_.SHORT)
    s = sim_.scaled(c, f)
    assert s.estimate == pytest.approx(slow.estimate, rel=1e-12)
    assert s.ci == pytest.approx(slow.ci, rel=1e-12)
    assert np.allclose(s.boot, slow.boot, rtol=1e-12)
    assert s.robust_log_var == pytest.approx(slow.robust_log_var, rel=1e-9)


def test_simulated_cells_measure_the_per_token_cost_and_grow_noisier_with_depth():
    sim = sim_.Sim(pool=60)
    rg = sim_.REGIMES["h200"]
    sd = []
    for d in sim_.DEPTHS:
        est = np.array([c.estimate for c in sim.pool(0.0, d, rg, sim_.ROUNDS)])
        assert np.median(est) == pytest.approx(sim_.TPT_MS[d], rel=0.01)
        sd.append(np.std(np.log(est)))
    assert sd[0] < sd[1] < sd[2]


def test_server_offsets_are_shared_by_the_depths_a_server_serves():
    sim = sim_.Sim(pool=30)
    cells = sim.servers(sim_.Regime("t", 0.2, 0.0, (1e-6,) * 3), "a", 2, {})
    by = {}
    for _arm, d, server, c in cells:
        by.setdefault(server, []).append(c.estimate / sim_.TPT_MS[d])
    assert all(np.ptp(v) < 1e-3 for v in by.values()) and len(by) == 2


def test_vectorised_mcnemar_is_mcnemar_exact():
    b, c = np.array([0, 1, 9, 3, 5, 0, 7, 40]), np.array([0, 9, 1, 1, 5, 5, 30, 35])
    assert sim_.mcnemar_p(b, c) == pytest.approx([signoff.mcnemar_exact(int(x), int(y)) for x, y in zip(b, c)])


# -- between arms ---------------------------------------------------------------------------------
REGIMES = ["h200", "h200-heavy", "cpu", "h200-growing"]


def test_one_server_per_arm_is_always_insufficient_replication(figs):
    assert figs["aa_insufficient_k1"].value == 1.0


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("regime", REGIMES)
def test_aa_false_decisions_family_wise_and_coverage(figs, k, regime):
    f = figs[f"aa_decided_{regime}_k{k}"]
    assert f.n == N and f.value <= _tol(f)
    assert figs[f"aa_coverage_{regime}_k{k}"].value >= 0.93
    for d in sim_.DEPTHS:  # at every depth too (3 Monte-Carlo se of N below 93 %): the growing excess at 32K
        assert figs[f"aa_coverage_{regime}_k{k}_{d}"].value >= 0.93 - cf.tol(0.95, N)


def test_mde_shrinks_with_servers_and_grows_with_the_server_spread(figs):
    m = {key: figs[f"aa_mde_{key}"].value for key in ("h200_k2", "h200_k4", "cpu_k2", "cpu_k4")}
    assert m["h200_k4"] < m["h200_k2"] and m["cpu_k4"] < m["cpu_k2"] and m["h200_k2"] < m["cpu_k2"]
    assert all(figs[f"aa_mde_{r}_k{k}"].value > sim_.REGIMES[r].min_effect for r in REGIMES for k in (2, 4))


@pytest.mark.parametrize("regime", ["h200", "cpu", "h200-growing"])
def test_the_printed_mde_has_the_power_it_claims(figs, regime):
    # at the MDE of the true variance the rule calls the change 80 % of the time (3 MC se + 3 points)
    f = figs[f"mde_power_true_{regime}"]
    assert abs(f.value - 0.80) <= cf.tol(0.8, f.n) + 0.03
    m = figs[f"mde_power_median_{regime}"]
    lo, hi = (0.75, 0.85) if regime == "h200-growing" else (0.55, 0.92)  # elsewhere the median se is below the true
    assert lo - cf.tol(0.8, m.n) <= m.value <= hi + cf.tol(0.8, m.n)


def test_following_servers_needed_gives_its_power(figs):
    # a run of the servers an A/A run printed as needed for a 1.5 % MDE at 32K calls a 1.5 % change 75-85 %
    f = figs["needed_power_h200-growing"]
    assert f.n >= 0.9 * N and 0.75 - cf.tol(0.8, f.n) <= f.value <= 0.85 + cf.tol(0.8, f.n)
    assert figs["needed_median_h200-growing"].value > 3  # more than the 3 it was printed from


@pytest.mark.parametrize("regime", ["h200", "cpu", "h200-growing"])
def test_equivalence_at_the_margin_is_rarely_claimed(figs, regime):
    f = figs[f"tost_size_{regime}"]
    assert f.value <= _tol(f)
    assert figs[f"tost_power_{regime}"].value > 0.05  # an A/A is shown equivalent some of the time


def test_holm_controls_the_family(figs):
    f = figs["family_holm"]
    assert f.value <= _tol(f)
    assert figs["family_raw"].value > f.value  # what the correction is for


@pytest.mark.parametrize("regime", ["cpu", "h200", "h200-growing"])
def test_the_adaptive_stop_keeps_its_coverage(figs, regime):
    f = figs[f"adaptive_coverage_{regime}"]  # 93 %, less 3 Monte-Carlo se of its experiments
    assert f.value >= 0.93 - cf.tol(0.95, f.n // 3)
    assert figs[f"adaptive_extra_{regime}"].value >= 1  # the pilot alone did not reach the target


# -- change points --------------------------------------------------------------------------------
def test_a_flat_history_with_run_to_run_variation_rarely_alarms(figs):
    f = figs["cp_flat"]
    assert f.value <= _tol(f)


def test_a_ten_percent_step_is_found(figs):
    assert figs["cp_step_found"].value >= 0.80


# -- gsm8k ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_q", [1319, 100, 10])
@pytest.mark.parametrize("drop", ["m", "m15"])
def test_a_drop_at_or_beyond_the_margin_rarely_passes(figs, n_q, drop):
    f = figs[f"ni_{n_q}_{drop}"]
    assert f.value <= _tol(f)
    assert figs[f"ni_{n_q}_{drop}_old"].value > 0.15  # the old rule passed these often


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
    assert figs["aa_pass_5"].value < figs["aa_pass_2"].value  # more discordance, less power


# -- the printed table ----------------------------------------------------------------------------
def test_markdown_table_and_cli_arguments(figs):
    md = conformance_figures.markdown(list(figs.values()))
    lines = md.splitlines()
    assert lines[0].startswith("| figure | design |") and len(lines) == 2 + len(figs)
    assert "**no**" not in md
    f = figs["aa_decided_cpu_k4"]
    lo, hi = f.interval
    assert lo <= f.value <= hi and f"(n {N})" in md
    with pytest.raises(SystemExit):
        cf.main(["--experiments", "3"])


def test_every_design_meets_its_target(figs):
    # the adaptive rule's 32K coverage under a growing excess was the last open row (about 92 %) until
    # each depth got its own excess from 3 servers per arm (e2e/stats/excess.py)
    missed = [f"{f.key}: {f.value:.3f} ({f.target})" for f in figs.values() if f.ok is False]
    assert missed == []


def test_rates_are_reproducible():
    def draw():
        sim = sim_.Sim(seed=3, pool=40)
        return [
            c.p
            for _ in range(3)
            for *_, c in sim_.family(sim.experiment(sim_.REGIMES["cpu"], 2, {"ref": {}, "arm": {}}), "ref", 5.0)
        ]

    a, b = draw(), draw()
    assert a == b and all(math.isfinite(p) for p in a)


def test_the_adaptive_rows_run_alone_per_regime():
    from e2e.validation import conformance_adaptive as ca

    out: list[str] = []
    ca.main(["--regime", "cpu", "--experiments", "10"], out.append)
    rows = out[0].splitlines()[2:]
    assert len(rows) == 7 and all("A/A, cpu," in r for r in rows)
    assert "mean GPU-minutes of the second stage" in out[0]
    with pytest.raises(SystemExit):
        ca.main(["--experiments", "3"])
