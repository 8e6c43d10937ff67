"""Conformance of the prefill guard (e2e/validation/conformance_guard.py): simulated server timings with
noise, a constant offset, a length-dependent bias, missing values. The run-wide guard it replaced
read a +6 ms long-request prefill at 32K as "faster" in about a quarter of A/A runs, and 2 %
missing prefill times widened the 32K interval by a third (the plain estimate everywhere); these
rows fail on that rule. `python -m e2e.validation.conformance_guard` prints the table (400 per design)."""

from __future__ import annotations

import pytest

from e2e.validation import conformance_guard as cg

N = 60  # experiments per design


@pytest.fixture(scope="module")
def figs() -> dict[str, cg.Figure]:
    return {f.key: f for f in cg.run(N)}


def test_every_guard_row_meets_its_target(figs):
    missed = [f"{f.key}: {f.value:.3f} ({f.target})" for f in figs.values() if f.ok is False]
    assert missed == []
    assert sum(1 for k in figs if k.startswith("guard_aa_")) == len(cg.sst.FAULTS)
    assert sum(1 for k in figs if k.startswith("guard_cover_")) == 3 * len(cg.sst.FAULTS)


def test_the_length_dependent_bias_fooled_the_old_guard_and_not_the_new_one(figs):
    slug = "long_6_ms_at_32K_6_ms_prefill_jitter"
    assert figs[f"guard_old_{slug}"].value >= 0.10
    assert figs[f"guard_aa_{slug}"].value <= 0.05 + cg.tol(0.05, N)
    assert figs[f"guard_trusted_{slug}"].value <= 0.15
    assert figs["guard_trusted_noise"].value >= 0.85  # and a well-reported server keeps the correction


def test_missing_prefill_times_keep_the_corrected_precision(figs):
    assert figs["guard_missing_hw"].value <= 1.15
    assert figs["guard_missing_hw_old"].value >= 1.2


def test_the_simulated_run_keeps_one_estimator_per_point_as_a_run_does():
    """analysis/estimator.py puts every arm at a point on the plain estimate where any arm there falls
    back; the simulation read each arm under its own choice, a ratio of the corrected estimate to the
    plain one that a run never reports (its 32K coverage under a 6 ms prefill jitter read 91.8 %)."""
    ts = cg.sst.TimedSim()
    cells = ts.experiment(3, {"ref": cg.sst.FAULTS["noise"], "arm": cg.sst.FAULTS["long +10 ms at 32K"]})
    chosen, how = cg.sst.new_rule(cells, 1.0)
    assert how[("arm", 32768)] == how[("ref", 32768)] == cg.sst.CLIENT
    assert how[("ref", 1024)] == cg.sst.CORRECTED
    plain = [c.plain for a, d, _, c in cells if (a, d) == ("ref", 32768)]
    assert [c for a, d, _, c in chosen if (a, d) == ("ref", 32768)] == plain


def test_too_few_experiments_is_one_clear_line(capsys):
    with pytest.raises(SystemExit):
        cg.main(["--experiments", "3"])
    assert "want at least 10 experiments" in capsys.readouterr().err
