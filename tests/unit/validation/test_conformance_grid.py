"""Batch-c verdicts that hold (issue 43 item 7): simulated grid runs like results/h200-load-tp1 (1K/8K x
c 1/4/16/32, A/A, 2 + 2 servers), decided by the function a run decides with
(e2e/validation/sim_grid.py -> comparisons.decide), with a server x concurrency term of 1.8 % calibrated
on the committed FA3 pass pairs. The full rows, 200 runs a design, are
`python -m e2e.validation.conformance_grid` (docs/statistics/conformance.md)."""

from __future__ import annotations

import math

import pytest

from e2e.design.point import Point
from e2e.stats import excess as ex
from e2e.stats import variance_model as vm
from e2e.validation import sim_grid
from e2e.validation.conformance_figures import covers_one, rate, tol
from tests.support import ROOT

N = 40  # runs: the 1K x 32 coverage floor is 93 % less 3 Monte-Carlo se of 40 runs (10.3 points)


def _coverage_at_quiet_point(monkeypatch: pytest.MonkeyPatch | None) -> tuple[float, float]:
    if monkeypatch is not None:  # the model before: batch-c points share the batch-1 excess
        monkeypatch.setattr(ex, "batch_blocks", lambda groups: ())
    sim = sim_grid.GridSim(pool=40)
    rg = sim_grid.GRID_REGIMES["h200-grid"]
    fams = [sim_grid.family(sim.run(rg, 2, {"ref": {}, "arm": {}}), "ref", rg.min_effect) for _ in range(N)]
    quiet = Point(1024, 32)
    return rate([covers_one(f[quiet]) for f in fams]), rate(
        [any(c.decision in ("slower", "faster") for c in f.values()) for f in fams]
    )


def test_the_quiet_batch_c_point_keeps_its_coverage_where_the_old_model_lost_it(monkeypatch):
    floor = 0.93 - tol(0.95, N)
    new, new_fw = _coverage_at_quiet_point(None)
    assert new >= floor and new_fw <= 0.05 + tol(0.05, N)
    old, _ = _coverage_at_quiet_point(monkeypatch)  # same seed, same cells
    assert old < floor, f"the old model covered {old:.1%} at 1K x 32: the test no longer tells the two apart"


def test_a_grid_of_two_servers_per_arm_gives_each_concurrency_above_batch_1_an_excess_of_its_own():
    groups = [(a, Point(d, c)) for a in ("ref", "arm") for _ in range(2) for c in (1, 4, 32) for d in (1024, 8192)]
    assert ex.batch_blocks(groups) == ((Point(1024, 4), Point(8192, 4)), (Point(1024, 32), Point(8192, 32)))
    assert ex.batch_blocks(groups[:6]) == ()  # one server per arm: nothing to estimate a term from
    assert ex.per_point_supported(groups + groups[:6]) is False  # 3 servers of ref only
    cells = [vm.Cell(a, p, f"{a}{i // 6}", 5, 5) for i, (a, p) in enumerate(groups)]
    d, theta = vm.planned(cells, 1e-5, 4e-4, {Point(1024, 1): 0.01, Point(8192, 1): 0.01})
    assert [len(b) for b in d.blocks] == [2, 2] and theta == pytest.approx((1e-5, 4e-4, 4e-4, 4e-4))


def test_the_grid_regime_is_the_committed_load_rows():
    cal = sim_grid.calibration(ROOT)
    assert cal["batch term c >= 16"] == pytest.approx(sim_grid.GRID_REGIMES["h200-grid"].batch, rel=0.1)
    sim = sim_grid.GridSim(pool=40)
    for p in sim_grid.POINTS:  # the simulated cells' noise within 25 % of the committed FA3 cells'
        sd = [math.sqrt(c.robust_log_var or 0.0) for c in sim.pool(p, 0.0)]
        assert sorted(sd)[len(sd) // 2] == pytest.approx(cal[f"noise {p}"], rel=0.25), p
