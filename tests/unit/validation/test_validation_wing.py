"""The validation wing (e2e/validation/) checks the rules a run executes, not copies of them: the
simulation's comparisons are the ones RunAnalysis decides on the same cells, and the run-to-run
conformance's truth is the prior `compare` and `history` assume."""

from __future__ import annotations

import dataclasses

import pytest

from e2e.analysis import run_prior
from e2e.analysis.run_analysis import RunAnalysis
from e2e.stats.run_to_run import RunSd
from e2e.validation import conformance_runs as cr
from e2e.validation import simulation as sim_
from tests.support.synthetic import make_run


def test_a_planted_run_is_decided_alike_by_run_analysis_and_the_simulation(tmp_path):
    """A run folder with a slower arm and an A/A arm, read by RunAnalysis, and its cells given to the
    simulation's decider: the same comparisons, the same Holm-adjusted p's, the same words."""
    run = make_run(tmp_path / "r", {"stock": 2.0, "slow": 2.2, "same": 2.0}, depths=sim_.DEPTHS, passes=3, between=0.01)
    r = RunAnalysis(run)
    cells = [(a, p.depth, r.server_of[(a, p, k)], cs) for (a, p, k), cs in r.cells.items()]
    got = {(a, d): c for a, d, c in sim_.family(cells, "stock", r.min_effect_pct, r.alpha)}
    pooled = {(c["arm"], c["depth"]): c for c in r.comparisons if c["scope"] == "pooled"}
    assert set(got) == set(pooled) and len(got) == 2 * len(sim_.DEPTHS)
    for key, row in pooled.items():
        c = got[key]
        assert (c.decision, c.decision_unadjusted) == (row["decision"], row["decision_unadjusted"]), key
        assert c.p_adjusted == pytest.approx(row["p_adjusted"]) and c.ratio == pytest.approx(row["ratio"]), key
    assert {pooled[("slow", d)]["decision"] for d in sim_.DEPTHS} == {"slower"}  # the plant is found


def test_the_run_to_run_conformance_takes_the_stated_prior(monkeypatch):
    """Its truth follows run_prior.stated(): change the stated prior and the generator's truth moves."""
    assert (cr.prior().level, cr.prior().ratio) == (run_prior.stated().level, run_prior.stated().ratio)
    other = dataclasses.replace(RunSd.flat(0.02, "x"), level={p: 0.02 for p in cr.POINTS})
    monkeypatch.setattr(run_prior, "stated", lambda: other)
    assert cr.prior().level == other.level and cr.prior().source == "the prior"
