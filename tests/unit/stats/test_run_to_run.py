"""Run-to-run variation where one run stands for a release (issue 34, item 1) and predictions with
their uncertainty (item 5): the stated prior and its measurement, compare and history widened by
it, the smallest step a history could have found, the dry run's MDE interval, and the conformance
rows of e2e/validation/conformance_runs.py."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from e2e.analysis import prior as prior_mod
from e2e.analysis import run_prior
from e2e.analysis.run_analysis import RunAnalysis
from e2e.cli.commands.compare import Compare
from e2e.cli.commands.history import History as HistoryCommand
from e2e.design.point import Point
from e2e.errors import UserError
from e2e.report import compare
from e2e.stats import changepoints as cp
from e2e.stats import planning, verdicts
from e2e.stats.run_to_run import RunSd, widen
from e2e.validation import conformance_runs as cr
from tests.support import ROOT
from tests.support.synthetic import make_run

RESULTS = ROOT / "results"
PRECISION, NEIGHBOUR = RESULTS / "h200-precision-tp1", RESULTS / "h200-neighbour-tp1"


# -- the prior -------------------------------------------------------------------------------------
def test_the_stored_prior_is_what_the_committed_runs_give():
    """PRIOR is measured, not typed in: the same-setup runs under results/ give it again (a new
    committed run of that setup, or a changed rule, fails here until PRIOR is updated)."""
    assert run_prior.measure(RESULTS) == run_prior.PRIOR
    assert len(run_prior.PRIOR["runs"]) == 5 and "h200-fork-tp1" not in run_prior.PRIOR["runs"]


def test_an_arm_other_than_the_reference_adds_its_ratio_sd_and_other_points_take_the_largest():
    sd = run_prior.stated()
    assert sd.sd(Point(32768), True) == pytest.approx(0.00311)
    assert sd.sd(Point(32768), False) == pytest.approx(math.hypot(0.00311, 0.00363))
    assert sd.sd(Point(4096, 4), True) == pytest.approx(0.00322)  # not measured: the largest level
    assert sd.sd(Point(4096, 4), False) == pytest.approx(math.hypot(0.00322, 0.00363))
    assert RunSd.flat(0.01, "x").sd(Point(1), False) == 0.01
    assert RunSd.flat(0.0, "x").off and not sd.off


def test_overrides_and_bad_priors_are_one_line(tmp_path):
    assert run_prior.run_sd(0.5).sd(Point(8192), False) == pytest.approx(0.005)
    assert run_prior.run_sd(None, None, 0.3).source == "the config's stats.run_sd_pct 0.3"
    f = tmp_path / "p.json"
    f.write_text(json.dumps({"points": [{"depth": 8192, "sd_level_pct": 0.4}]}))
    assert run_prior.run_sd(None, str(f)).sd(Point(8192), False) == pytest.approx(0.004)
    f.write_text(json.dumps({"points": [{"depth": 8192}]}))
    with pytest.raises(UserError, match="needs depth and sd_level_pct"):
        run_prior.run_sd(None, str(f))
    f.write_text(json.dumps({"points": [{"depth": 8192, "sd_level_pct": -1}]}))
    with pytest.raises(UserError, match="finite sds >= 0"):
        run_prior.run_sd(None, str(f))
    with pytest.raises(UserError, match="--run-sd 'x'"):
        _parse(Compare().add_arguments, "a", "b", "--run-sd", "x")
    with pytest.raises(UserError, match="--run-sd 'nan'"):
        _parse(Compare().add_arguments, "a", "b", "--run-sd", "nan")


def _parse(add, *argv):
    p = argparse.ArgumentParser()
    add(p)
    return p.parse_args(list(argv))


# -- widening --------------------------------------------------------------------------------------
def _cmp(se=0.002, df=10.0, ratio=1.006, me=0.5):
    c = verdicts.Comparison(
        ratio, (1.0, 1.01), verdicts.BETWEEN, 0.01, 0.5, df, se, 2, 2, "m", None, 0.06, (0.02, 0.1), 0.05, me
    )
    c.p, c.decision = 0.004, verdicts.SLOWER
    return c


def test_widen_adds_a_known_variance_and_re_decides():
    c = widen(_cmp(), 2 * 0.0024**2, 11.0)
    assert c.se_log == pytest.approx(math.sqrt(0.002**2 + 2 * 0.0024**2))
    assert c.df > 10  # a known variance added: more df, not fewer
    assert c.ratio == 1.006 and c.ci[0] < 1 < c.ci[1] and c.p > 0.05
    assert c.decision == verdicts.INCONCLUSIVE and "run-to-run sd" in c.model
    assert c.diff_ci[1] - c.diff_ci[0] > 0.08  # the ms interval widened alike
    within = _cmp()
    within.ci_kind = verdicts.WITHIN
    assert widen(within, 0.01).se_log == 0.002  # no between-server test: nothing to widen


# -- compare ---------------------------------------------------------------------------------------
def test_same_software_on_two_days_is_no_longer_slower_on_one_run_a_side():
    """Issue 34: precision vs neighbour (vLLM 0.26.0 both), widened at 8K 1.006 (1.002 to 1.010),
    Holm p 0.021, called "slower" at a 0.5 % min effect by servers taken as exchangeable."""
    a, b = RunAnalysis(PRECISION), RunAnalysis(NEIGHBOUR)
    a.min_effect_pct = 0.5
    old = {(r["arm"], r["depth"]): r for r in compare.compare_runs(a, b)[0]}
    assert old[("widened", 8192)]["decision"] == verdicts.SLOWER
    new = {(r["arm"], r["depth"]): r for r in compare.compare_runs(a, b, run_sd=run_prior.stated())[0]}
    w = new[("widened", 8192)]
    assert w["decision"] != verdicts.SLOWER and w["p_adjusted"] > 0.05
    assert w["ratio_ci_lo"] < 1 < w["ratio_ci_hi"] and w["ratio"] == pytest.approx(old[("widened", 8192)]["ratio"])
    assert w["run_sd_pct"] == pytest.approx(100 * math.hypot(0.00322, 0.00072))
    assert new[("stock", 8192)]["run_sd_pct"] == pytest.approx(0.322)


def test_compare_names_the_confound_and_run_sd_0_is_the_old_rule(capsys, tmp_path):
    out = tmp_path / "c.json"
    args = _parse(Compare().add_arguments, str(PRECISION), str(NEIGHBOUR), "--json", str(out))
    assert Compare().run(args) == compare.CANNOT_DECIDE  # widened: inconclusive at 1 %
    said = " ".join(capsys.readouterr().out.split())
    assert "one run per release (one run a side): a run-to-run sd of 0.15-0.48 % is assumed, not measured" in said
    j = json.loads(out.read_text())
    assert j["run_sd_source"].startswith("the stated prior") and all(r["run_sd_pct"] > 0 for r in j["rows"])
    args = _parse(Compare().add_arguments, str(PRECISION), str(NEIGHBOUR), "--run-sd", "0")
    assert Compare().run(args) == 0  # as before the prior: every row equivalent
    said = " ".join(capsys.readouterr().out.split())
    assert "no run-to-run sd assumed (--run-sd 0)" in said and "is assumed, not measured" not in said


# -- history ---------------------------------------------------------------------------------------
def _series(offsets, k=3, sd=0.001, seed=1):
    import numpy as np

    rng = np.random.default_rng(seed)
    return [[math.log(10.0) + o + rng.normal(0, sd) for _ in range(k)] for o in offsets]


def test_a_two_run_split_takes_the_stated_run_sd_and_says_so():
    runs = _series([0.0, 0.006])  # two runs 0.6 % apart, servers within 0.1 %
    old = cp.judge_series(runs, 0.05, 0.5)
    assert old.decision == verdicts.SLOWER and not old.run_sd_assumed
    new = cp.judge_series(runs, 0.05, 0.5, run_sd=0.003)
    assert new.decision != verdicts.SLOWER and new.run_sd_assumed
    worst = new.stretches[0].worst
    assert worst.run_variance.startswith("assumed: a run-to-run sd of 0.3 %")
    assert worst.ci[1] - worst.ci[0] > old.steps[0].ci[1] - old.steps[0].ci[0]
    with pytest.raises(UserError, match="run_sd"):
        cp.judge_series(runs, 0.05, 0.5, run_sd=math.nan)


def test_a_series_states_the_smallest_step_it_could_have_found():
    res = cp.judge_series(_series([0.0] * 8, seed=3), 0.05, 1.0)
    assert res.detectable_pct is not None and res.detectable_pct > 1.0
    assert res.detectable_pct == min(s.mde_pct for s in res.stretches)
    more = cp.judge_series(_series([0.0] * 8, sd=0.004, seed=3), 0.05, 1.0)
    assert more.detectable_pct > res.detectable_pct  # noisier servers: a larger step needed
    assert cp.judge_series([[1.0], [1.0]], 0.05, 2.0).detectable_pct is None  # nothing tested


def test_history_of_one_run_per_release_says_the_run_sd_is_assumed(tmp_path, capsys):
    runs = tmp_path / "runs"
    make_run(runs / "a", {"stock": 2.0, "widened": 2.0}, seed=1, passes=3, between=0.002, vllm="0.26.0")
    make_run(runs / "b", {"stock": 2.0, "widened": 2.0}, seed=2, passes=3, between=0.002, vllm="0.27.0")
    args = _parse(HistoryCommand().add_arguments, str(runs), "--out", str(tmp_path / "h"), "--allow-inconclusive")
    HistoryCommand().run(args)
    said = " ".join(capsys.readouterr().out.split())
    assert "one run per release (a split with one run a side): a run-to-run sd of" in said
    assert "finds %" in said
    j = json.loads((tmp_path / "h" / "history.json").read_text())
    assert all(s["detectable_pct"] and s["run_sd_pct"] > 0 for s in j["series"])


# -- the dry run's MDE interval ----------------------------------------------------------------------
def test_the_predicted_mde_comes_with_an_interval_from_the_earlier_run():
    comp = planning.Components.from_dict(
        json.loads((PRECISION / "summary.json").read_text())["variance_model"], str(PRECISION)
    )
    nu = prior_mod.prior_df(comp)
    assert set(nu) == {Point(1024), Point(8192), Point(32768)} and all(1 <= x <= 1000 for x in nu.values())
    lo, hi = prior_mod.mde_interval(0.003, 8.0, nu[Point(8192)], 0.05 / 3, 1.0)
    mid = planning.mde_pct(0.003, 8.0, 0.05 / 3, 1.0)
    assert lo < mid < hi
    assert prior_mod.mde_interval(0.003, 8.0, None, 0.05 / 3, 1.0) == (None, None)  # the default: none
    assert prior_mod.prior_df(planning.Components(0.0, 0.0, {}, source="default")) == {}


def test_the_mde_interval_comes_from_an_earlier_run_that_could_not_measure_every_point():
    """results/h200-load-tp1 has no stock group at 8K x 16 and x 32 (its rounds were refused): the
    dry run of another design on that prior crashed with a KeyError (found planning an H100 run)."""
    load = PRECISION.parent / "h200-load-tp1"
    comp = planning.Components.from_dict(json.loads((load / "summary.json").read_text())["variance_model"], str(load))
    nu = prior_mod.prior_df(comp)
    assert Point(1024, 16) in nu and Point(8192, 4) in nu
    assert Point(8192, 16) not in nu and Point(8192, 32) not in nu  # no reference there: no df


# -- conformance -----------------------------------------------------------------------------------
def test_conformance_rows():
    """The old rule's failure reproduced (far more than 5 % at a 1 % run sd; above 5 % at the prior
    with a 0.5 % min effect) and every target met with the prior (N small: the tolerance is wide;
    `python -m e2e.validation.conformance_runs` prints the table at N 400)."""
    figs = {f.key: f for f in cr.compare_figures(cr.Sim(11), 60) + cr.history_figures(cr.Sim(12), 40)}
    assert figs["cmp_old_1pct"].value > 0.5 and figs["hist_old_1pct"].value > 0.3
    assert figs["cmp_old_prior"].value > 0.05
    for key in ("cmp_prior", "cmp_prior_1", "cmp_half_prior", "cmp_flag_1pct", "hist_prior"):
        assert figs[key].ok, figs[key]


def test_the_config_states_a_run_sd_and_a_flag_overrides_it():
    from types import SimpleNamespace

    from e2e.design.config import parse_config
    from e2e.rundir.manifest_model import recorded_config

    base = {"model": {"path": "m"}, "workload": {"depths": [1024]}, "arms": [{"name": "stock"}]}
    assert parse_config({**base, "stats": {"run_sd_pct": 0.4}}).stats.run_sd_pct == 0.4
    with pytest.raises(Exception, match="run_sd_pct"):
        parse_config({**base, "stats": {"run_sd_pct": -1}})

    def analysed(manifest):  # what run_sd_of reads of a RunAnalysis: the manifest and its config, typed
        return SimpleNamespace(manifest=manifest, config=recorded_config(manifest, "manifest.json"))

    run = analysed({"config": {"stats": {"run_sd_pct": 0.4}}})
    args = _parse(Compare().add_arguments, "a", "b")
    assert compare.run_sd_of(run, args.run_sd, args.run_prior).sd(Point(8192), False) == pytest.approx(0.004)
    args = _parse(Compare().add_arguments, "a", "b", "--run-sd", "0.1")
    assert compare.run_sd_of(run, args.run_sd, args.run_prior).sd(Point(8192), False) == pytest.approx(0.001)
    assert compare.run_sd_of(analysed({}), args.run_sd, args.run_prior).source == "--run-sd 0.1"
