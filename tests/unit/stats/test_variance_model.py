"""e2e.stats.variance_model: the REML fit against statsmodels where both apply, the pooled noise, the
Satterthwaite degrees of freedom, and the fit of the committed H200 rows (issue 21's figures)."""

from __future__ import annotations

import json
import math
from collections import defaultdict

import numpy as np
import pytest
from scipy import stats as st

from e2e.design.point import Point
from e2e.stats import cells as stats
from e2e.stats import reml
from e2e.stats import variance_model as vm
from tests.support import ROOT
from tests.support.synthetic import L, S, cs, per_arm_pass, quiet


def test_reml_matches_statsmodels_mixedlm_without_cell_noise():
    """No sampling noise of the cells' own: the model is y ~ arm x depth + (1 | server) + e, which
    statsmodels' MixedLM fits by REML too; the variance components agree."""
    sm = pytest.importorskip("statsmodels.formula.api")
    import pandas as pd

    rng = np.random.default_rng(7)
    cells = per_arm_pass(rng, k=5)
    f = vm.fit(cells, per_point=False)  # statsmodels has one residual variance: the excess one for every point
    df = pd.DataFrame(
        {
            "y": np.log([c.estimate for *_, c in cells]),
            "g": [f"{a}{d}" for a, d, _, _ in cells],
            "server": [s for _, _, s, _ in cells],
        }
    )
    m = sm.mixedlm("y ~ 0 + C(g)", df, groups=df["server"]).fit(reml=True, method="lbfgs")
    assert f.design.components == vm.SERVER_CELL
    assert f.sigma2_server == pytest.approx(float(m.cov_re.iloc[0, 0]), rel=2e-3)
    assert f.tau2 == pytest.approx(float(m.scale), rel=2e-3)
    assert np.allclose(sorted(f.beta), sorted(m.fe_params.values), atol=1e-8)


def test_fresh_servers_fold_the_two_components_into_one():
    rng = np.random.default_rng(1)
    cells = [
        (a, d, f"{a}{d}{s}", quiet(10.0 * math.exp(rng.normal(0, 0.03))))
        for a in "ab"
        for d in (1, 2)
        for s in range(3)
    ]
    f = vm.fit(cells)
    assert f.design.components == vm.CELL_ONLY and f.sigma2_server == 0.0 and f.tau2 > 0


def test_a_shared_server_offset_is_estimated_from_every_depth():
    rng = np.random.default_rng(3)
    f = vm.fit(per_arm_pass(rng, k=6, sd_server=0.05, sd_cell=0.002), per_point=False)
    assert 0.02 < math.sqrt(f.sigma2_server) < 0.10 and math.sqrt(f.tau2) < 0.006


def test_satterthwaite_df_few_when_servers_dominate_many_when_the_cells_noise_does():
    # one excess for every point (the model below 3 servers per arm, forced here at 3)
    rng = np.random.default_rng(5)
    loud = vm.fit(per_arm_pass(rng, k=3, sd_server=0.05, sd_cell=0.0, noise=0.0002), per_point=False)
    e = loud.contrast("b", "a", 2)
    assert 2.5 < e.df < 8  # about 2 x 3 - 2 servers' worth
    rng = np.random.default_rng(5)
    cells = per_arm_pass(rng, k=3, sd_server=0.0005, sd_cell=0.0, noise=0.004)
    noisy = vm.fit(cells, per_point=False)
    assert noisy.contrast("b", "a", 2).df > 2 * e.df
    # the price of an excess per point (the model at 3 servers per arm): each rests on its own
    # point's cells, so even where the noise dominates the df are about one point's servers'
    own = vm.fit(cells)
    assert own.excess.model == vm.PER_POINT and own.contrast("b", "a", 2).df < noisy.contrast("b", "a", 2).df / 2


def test_the_pooled_noise_is_the_df_weighted_mean_of_the_cells():
    c1, c2 = cs(10.0, rounds=8, noise=0.002, seed=1), cs(10.0, rounds=20, noise=0.002, seed=2)
    d = vm.Design(
        [
            vm.Cell("a", 1, "s1", c1.noise.n_long, c1.noise.n_short),
            vm.Cell("a", 1, "s2", c2.noise.n_long, c2.noise.n_short),
        ]
    )
    n = vm.pool_noise(d, [c1, c2])
    nu1, nu2 = stats.median_variance_factor(8)[1], stats.median_variance_factor(20)[1]
    q1 = (c1.noise.scale_long / (c1.estimate * (L - S) / 1e3)) ** 2
    q2 = (c2.noise.scale_long / (c2.estimate * (L - S) / 1e3)) ** 2
    assert n.q[0, 0] == pytest.approx((nu1 * q1 + nu2 * q2) / (nu1 + nu2))
    assert n.nu[0, 0] == pytest.approx(nu1 + nu2)


def test_reml_is_the_likelihood_maximum():
    """Fisher scoring lands where a brute-force search of the REML likelihood does."""
    rng = np.random.default_rng(11)
    cells = per_arm_pass(rng, k=3, sd_server=0.01, sd_cell=0.004, noise=0.003)
    f = vm.fit(cells, per_point=False)  # two components, searched on a grid below
    d, v, y = f.design, f.noise.v(f.design), f.y

    def nll(t):
        P, _, ld, ldx = reml.projection(d, reml.covariance(d, v, t))
        return 0.5 * (ld + ldx + float(y @ P @ y))

    best = nll(f.theta)
    for a in np.linspace(0, 3 * f.theta[0] + 1e-6, 25):
        for b in np.linspace(0, 3 * f.theta[1] + 1e-6, 25):
            assert nll((a, b)) >= best - 1e-7


def test_no_variance_to_estimate_gives_no_fit():
    assert vm.fit([("a", 1, "s", cs(10.0))]) is None
    assert vm.fit([("a", 1, "s1", cs(10.0)), ("b", 1, "s2", cs(11.0))]) is None  # one cell per group


def _h200_cells(run: str, estimator: str):
    root = ROOT / "results" / run
    rows = [json.loads(x) for x in (root / "requests.jsonl").read_text().splitlines()]
    cells = {c["cell_id"]: c for c in map(json.loads, (root / "cells.jsonl").read_text().splitlines())}
    by = defaultdict(list)
    for r in rows:
        c = cells.get(r["cell_id"])
        if c and r["attempt"] == c["attempt"]:
            by[r["cell_id"]].append(r)
    return [
        (
            c["arm"],
            c["depth"],
            f"{c['server_key']}#{c['attempt']}",
            stats.cell_stats(by[cid], L, S, estimator=estimator),
        )
        for cid, c in cells.items()
        if c["status"] == "ok"
    ]


def test_the_committed_reference_run_resolves_a_percent_at_32k():
    """Issue 21's figure, from the committed H200 rows (results/h200-reference-tp1): the widened/stock
    95 % interval at 32K was +-4.6 % with the plain estimator and a per-depth pooled t; the corrected
    estimator with the variance pooled over depths brings it within +-1 %."""
    f = vm.fit(_h200_cells("h200-reference-tp1", "prefill-corrected"))
    e = f.contrast("widened", "stock", 32768)
    hw = 100 * math.expm1(st.t.ppf(0.975, e.df) * e.se)
    assert hw < 1.0, hw
    plain = vm.fit(_h200_cells("h200-reference-tp1", "client")).contrast("widened", "stock", 32768)
    assert plain.se > 2 * e.se


def _growing(seed, excess, per_point=False, k=6):
    from e2e.validation import simulation as sim_

    rg = sim_.Regime("t", 0.002, excess, (0.001, 0.002, 0.005), min_effect=1.0)
    cells = sim_.Sim(seed=seed, pool=40).experiment(rg, k, {"ref": {}, "arm": {}})
    return vm.fit([(a, sim_.Point(d), s, c) for a, d, s, c in cells], per_point=per_point)


def test_the_cell_excess_grows_with_the_noise_when_the_likelihood_says_so_and_planning_keeps_it():
    from e2e.stats import planning

    f = _growing(11, (0.0005, 0.002, 0.012))
    assert f.excess.model == vm.PROPORTIONAL and f.excess.gain > 0
    pts = sorted({c.point for c in f.design.cells})
    assert f.tau2_at(pts[0]) < f.tau2_at(pts[-1]) == pytest.approx(f.tau2)
    d = f.to_dict()
    assert d["cell_excess"]["model"] == vm.PROPORTIONAL and all("sd_cell_excess" in g for g in d["groups"])
    comp = planning.Components.from_dict(d, "test")  # the prior of a later --dry-run
    assert comp.weights == pytest.approx(f.design.weights) and planning.Components.of(f).weights == f.design.weights
    # one design, both readings: the same predicted se at 32K
    cells = planning.hypothetical_cells(["ref", "arm"], pts, 3, {p: 6 for p in pts}, True)
    a = planning.predict(comp, cells, "ref", [("arm", pts[-1])])
    b = planning.predict(planning.Components.of(f), cells, "ref", [("arm", pts[-1])])
    assert a[("arm", pts[-1])][0] == pytest.approx(b[("arm", pts[-1])][0], rel=1e-9)


def test_at_one_point_the_two_excess_models_are_one_and_no_choice_is_stated():
    rng = np.random.default_rng(3)
    f = vm.fit(per_arm_pass(rng, k=4, depths=(1,), sd_server=0.01, sd_cell=0.005))  # 4 servers, one point
    assert f.excess.model == "one for every point" and f.excess.to_dict()["rule"] is None
    assert f.design.weights is None and f.tau2_at(1) == f.tau2


def test_the_proportional_excess_is_weighed_by_each_points_noise_not_the_rounds_its_cells_ran():
    # an adaptive second stage gives 32K more rounds: weighed by the cells' own variances, 32K's
    # weight fell and the fit moved excess off 32K (coverage there 90 %, docs/statistics/adaptive.md)
    from e2e.validation import simulation as sim_

    rg = sim_.Regime("t", 0.002, (0.0005, 0.002, 0.012), (0.001, 0.002, 0.005), min_effect=1.0)
    sim = sim_.Sim(seed=11, pool=40)
    cells = [
        x
        for arm in ("ref", "arm")
        for x in sim.servers(rg, arm, 4, {}) + sim.servers(rg, arm, 2, {}, {1024: 6, 8192: 6, 32768: 64}, tag="x")
    ]
    f = vm.fit([(a, sim_.Point(d), s, c) for a, d, s, c in cells], per_point=False)
    assert f is not None and f.excess.model == vm.PROPORTIONAL
    k_long, k_short = stats.median_variance_factor(6)[0], stats.median_variance_factor(6)[0]  # the median rounds
    at_six = {}
    for j, (_, p) in enumerate(f.design.groups):
        at_six.setdefault(p, []).append(k_long * f.noise.q[j, 0] + k_short * f.noise.q[j, 1])
    top = max(np.mean(v) for v in at_six.values())
    assert f.design.weights == pytest.approx({p: np.mean(v) / top for p, v in at_six.items()}, rel=1e-9)
    equal = vm.Design([c for c in f.design.cells if c.n_long == 6])  # equal rounds: the cells' own variance
    assert equal.groups == f.design.groups
    assert np.array_equal(vm.noise_at_median_rounds(equal, f.noise), f.noise.v(equal))


def test_from_three_servers_per_arm_at_every_point_each_point_has_its_own_excess():
    """The excess grows 1 : 16 : 576 in variance, faster than the noise the proportional model ties
    it to: with 6 servers per arm the fit gives each point its own, which planning and a later
    dry run read back, and whose REML likelihood is at least the one-excess model's (nested)."""
    from e2e.stats import planning
    from e2e.stats.excess import MIN_SERVERS

    truth = (0.0005, 0.002, 0.012)
    f = _growing(11, truth, per_point=True)
    pts = sorted({c.point for c in f.design.cells})
    assert f.excess.model == vm.PER_POINT and f.design.per_point and MIN_SERVERS == 3
    assert f.tau2 == max(f.tau2_at(p) for p in pts) == f.tau2_at(pts[-1])
    assert 0.25 < f.tau2_at(pts[-1]) / truth[-1] ** 2 < 4  # 10 df at the point: within a factor 4
    assert f.tau2_at(pts[0]) < 0.1 * f.tau2_at(pts[-1])
    d = f.to_dict()
    assert d["cell_excess"] == {
        "model": vm.PER_POINT,
        "rule": "every arm has at least 3 servers at every point",
        "loglik_gain": None,
    }
    assert all("sd_cell_excess" in g for g in d["groups"])
    comp = planning.Components.from_dict(d, "test")
    assert comp.weights == pytest.approx(planning.Components.of(f).weights, rel=1e-12)
    assert comp.weights[pts[-1]] == 1.0 and comp.weights[pts[0]] < 0.1
    # a planned design of 3 servers per arm is fitted the same way, so planning predicts it so
    for k, model in ((3, True), (2, False)):
        cells = planning.hypothetical_cells(["ref", "arm"], pts, k, {p: 6 for p in pts}, True)
        design, theta = vm.planned(cells, comp.sigma2_server, comp.tau2, comp.weights)
        assert design.per_point is model
        assert len(theta) == (1 + len(pts) if model else 2)
    one = _growing(11, truth, per_point=False)
    y, noise = f.y, f.noise

    def nll(design, theta):
        P, _, ld, ldx = reml.projection(design, reml.covariance(design, noise.v(design), theta))
        return 0.5 * (ld + ldx + float(y @ P @ y))

    assert nll(f.design, f.theta) <= nll(one.design, one.theta) + 1e-9
    # below 3 servers per arm the AIC choice of one or proportional stands
    assert _growing(11, truth, per_point=True, k=2).excess.model in (vm.PROPORTIONAL, "one for every point")


def test_a_per_point_excess_with_no_server_factor_carries_the_server_variance_at_each_point():
    """Fresh servers (one cell each): the planned components fold the server's variance into every
    point's excess, as the one-excess design folds it into its one."""
    from e2e.stats import planning

    pts = [Point(1024), Point(32768)]
    cells = planning.hypothetical_cells(["ref", "arm"], pts, 3, {p: 6 for p in pts}, False)
    d, theta = vm.planned(cells, 1e-4, 4e-6, {pts[0]: 0.25, pts[1]: 1.0})
    assert d.per_point and not d.kept and theta == pytest.approx((1e-4 + 1e-6, 1e-4 + 4e-6))


def test_a_cell_left_with_one_round_of_a_length_keeps_the_fit_finite():
    """The stall check can leave a cell one round of a length (the H100 run of 2026-12-06: 8K x 16, one
    short round of five): its median is that round, of the per-value variance (factor 1, df 0), where
    a NaN factor made the REML search's SVD fail and `report` stop."""
    from e2e.stats.cells import median_variance_factor

    assert median_variance_factor(1) == (1.0, 0.0)
    assert median_variance_factor(2)[0] < 1.0  # a median of two varies less than one value
