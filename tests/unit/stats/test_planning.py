"""e2e.stats.planning: the decision rule's power by an independent Monte Carlo, the MDE and
servers-needed pair, predictions against a fit's own algebra, and the adaptive allocation against a
brute-force search. Rates over whole simulated runs: tests/unit/validation/test_conformance.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from e2e.stats import planning
from e2e.stats import variance_model as vm
from tests.support.synthetic import per_arm_pass


@pytest.mark.parametrize(
    "se,df,alpha,m,delta",
    [
        (0.01, 3.0, 0.05 / 3, 2.0, 0.04),
        (0.004, 12.0, 0.05 / 6, 1.0, 0.015),
        (0.02, 1000.0, 0.05, 2.0, 0.05),
        (0.002, 6.0, 0.05 / 3, 2.0, 0.021),
    ],
)
def test_power_is_the_rules_by_simulation(se, df, alpha, m, delta):
    """Draw the estimate and its se as the model says; apply verdicts' rule (p < alpha and the
    ratio at least m % from 1). 200,000 draws: Monte-Carlo sd < 0.1 %; tolerance 0.5 points."""
    rng = np.random.default_rng(1)
    n = 200_000
    d_hat = rng.normal(delta, se, n)
    se_hat = se * np.sqrt(rng.chisquare(df, n) / df) if df < vm.MAX_DF else np.full(n, se)
    p = 2 * st.t.sf(np.abs(d_hat) / se_hat, df)
    called = (p < alpha) & (np.expm1(d_hat) * 100 >= m)
    assert planning.power(delta, se, df, alpha, m) == pytest.approx(called.mean(), abs=0.005)


def test_the_mde_is_always_above_the_min_effect_and_has_its_power():
    for se in (0.0005, 0.003, 0.02):
        mde = planning.mde_pct(se, 8.0, 0.05 / 6, 2.0)
        assert mde > 2.0
        assert planning.power(math.log1p(mde / 100), se, 8.0, 0.05 / 6, 2.0) == pytest.approx(0.80, abs=1e-6)
    # tiny se: the min-effect condition alone: a change just above it is called ~always
    assert planning.mde_pct(1e-5, 50.0, 0.05, 2.0) == pytest.approx(2.0, abs=0.01)


def test_predict_is_the_fits_own_algebra_for_the_same_design():
    rng = np.random.default_rng(2)
    f = vm.fit(per_arm_pass(rng, k=3, sd_server=0.01, sd_cell=0.002, noise=0.003))
    comp = planning.Components.of(f)
    pred = planning.predict(comp, f.design.cells, "a", [("b", 2)])
    e = f.contrast("b", "a", 2)
    se, df = pred[("b", 2)]
    assert se == pytest.approx(e.se, rel=1e-9) and df == pytest.approx(e.df, rel=1e-9)


def test_servers_needed_and_the_mde_agree():
    comp = planning.Components(0.01**2, 0.0, {(a, d): (0.01**2, 0.01**2) for a in "ab" for d in (1, 2)})
    rounds = {1: 8, 2: 8}
    need = planning.servers_needed(comp, ["a", "b"], [1, 2], rounds, True, 0.05 / 2, 2.0, 4.0)
    for key, n in need.items():
        at = planning.mde_for_design(comp, ["a", "b"], [1, 2], n, rounds, True, 0.05 / 2, 2.0)[key]
        below = planning.mde_for_design(comp, ["a", "b"], [1, 2], n - 1, rounds, True, 0.05 / 2, 2.0)[key]
        assert at <= 4.0 < below
    # an MDE target below the min effect can never be reached
    assert set(planning.servers_needed(comp, ["a", "b"], [1, 2], rounds, True, 0.05, 2.0, 1.9).values()) == {None}


def test_the_allocation_is_the_cheapest_of_a_brute_force_search():
    comp = planning.Components(
        0.001**2,
        0.0,
        {("a", 1): (0.004**2,) * 2, ("b", 1): (0.004**2,) * 2, ("a", 2): (0.02**2,) * 2, ("b", 2): (0.02**2,) * 2},
    )
    existing = planning.hypothetical_cells(["a", "b"], [1, 2], 2, {1: 6, 2: 6}, True, tag="pilot")
    costs = planning.Costs(
        {"a": 90.0, "b": 90.0},
        {(a, d): 2.0 for a in "ab" for d in (1, 2)},
        {(a, 1): 1.0 for a in "ab"} | {(a, 2): 6.0 for a in "ab"},
    )
    alloc = planning.allocate(comp, existing, ["a", "b"], [1, 2], True, costs, 0.6, 6)
    assert alloc.met and alloc.extra_passes >= 1
    best = None
    for P in range(1, 7):
        for r1 in planning.ROUND_GRID:
            for r2 in planning.ROUND_GRID:
                rounds = {1: r1, 2: r2}
                cells = list(existing) + planning.hypothetical_cells(["a", "b"], [1, 2], P, rounds, True, tag="x")
                pred = planning.predict(comp, cells, "a", [("b", 1), ("b", 2)])
                if all(planning.half_width_pct(se, df) <= 0.6 for se, df in pred.values()):
                    cost = P * costs.of_pass(["a", "b"], [1, 2], rounds, True)
                    best = cost if best is None else min(best, cost)
    assert alloc.predicted_s == pytest.approx(best, rel=1e-9)
    assert alloc.considered < 100  # the bisection, not the grid


def test_an_unreachable_target_says_so():
    comp = planning.Components(0.05**2, 0.0, {(a, 1): (0.01**2,) * 2 for a in "ab"})
    existing = planning.hypothetical_cells(["a", "b"], [1], 2, {1: 6}, True, tag="pilot")
    costs = planning.Costs({"a": 90.0, "b": 90.0}, {(a, 1): 1.0 for a in "ab"}, {(a, 1): 1.0 for a in "ab"})
    alloc = planning.allocate(comp, existing, ["a", "b"], [1], True, costs, 0.5, 3)
    assert not alloc.met and alloc.extra_passes == 3


def test_the_allocation_stays_within_a_time_budget():
    comp = planning.Components(0.001**2, 0.0, {(a, 1): (0.02**2,) * 2 for a in "ab"})
    existing = planning.hypothetical_cells(["a", "b"], [1], 2, {1: 6}, True, tag="pilot")
    costs = planning.Costs({"a": 90.0, "b": 90.0}, {(a, 1): 2.0 for a in "ab"}, {(a, 1): 6.0 for a in "ab"})
    free = planning.allocate(comp, existing, ["a", "b"], [1], True, costs, 0.3, 4)
    tight = planning.allocate(comp, existing, ["a", "b"], [1], True, costs, 0.3, 4, max_cost_s=0.9 * free.predicted_s)
    assert tight.predicted_s <= 0.9 * free.predicted_s
    none = planning.allocate(comp, existing, ["a", "b"], [1], True, costs, 0.3, 4, max_cost_s=100.0)
    assert none.extra_passes == 0 and not none.met  # one pass (two starts) costs more than 100 s
