"""compare and history as a gate that never passes blind: a point they cannot tell exits 3 unless
--allow-inconclusive; a significant change below the min effect is said as such; each run counts
once in a history; names and paths from the data are printed, never read as rich markup."""

from __future__ import annotations

import argparse
import json
import shutil

from e2e.analysis.run_analysis import RunAnalysis
from e2e.cli import main
from e2e.cli.commands.compare import Compare
from e2e.cli.commands.history import History as HistoryCommand
from e2e.design.point import Point
from e2e.report import compare, history_runs
from e2e.stats import verdicts
from tests.support import ROOT
from tests.support.synthetic import make_run

RESULTS = ROOT / "results"


def _compare(capsys, a, b, *extra):
    p = argparse.ArgumentParser()
    Compare().add_arguments(p)
    rc = Compare().run(p.parse_args([str(a), str(b), *extra]))
    return rc, " ".join(capsys.readouterr().out.split())


def _history(capsys, folder, *extra):
    p = argparse.ArgumentParser()
    HistoryCommand().add_arguments(p)
    rc = HistoryCommand().run(p.parse_args([str(folder), *extra]))
    return rc, " ".join(capsys.readouterr().out.split())


def test_the_committed_cpu_release_pair_cannot_tell_and_exits_3(capsys, tmp_path):
    """Every row inconclusive (MDE 34-45 %): that is not "no regression", it is exit 3."""
    out = tmp_path / "cmp.json"
    a, b = RESULTS / "cpu-vllm-0.30.0", RESULTS / "cpu-vllm-0.31.0"
    rc, said = _compare(capsys, a, b, "--json", str(out))
    assert rc == compare.CANNOT_DECIDE
    j = json.loads(out.read_text())
    assert {r["decision"] for r in j["rows"]} == {verdicts.INCONCLUSIVE} and j["exit_status"] == 3
    assert "no regression" not in said and "exit status 3: done, but it cannot decide" in said
    rc, said = _compare(capsys, a, b, "--allow-inconclusive")
    assert rc == 0 and "4 inconclusive, allowed by --allow-inconclusive" in said
    assert "exit status 0: done: no row slower; inconclusive rows allowed" in said


def test_a_significant_change_below_the_min_effect_is_said_as_such(capsys, tmp_path):
    """Without a run-to-run sd (the servers of the two runs exchangeable) widened at 8K, 1.006 between
    the precision and the neighbour run, is a real change below a 0.7 % min effect (a copy of run A
    with that min effect; --force, as the settings then differ); the stated prior makes it a lack of
    power instead."""
    a = shutil.copytree(RESULTS / "h200-precision-tp1", tmp_path / "a")
    m = json.loads((a / "manifest.json").read_text())
    m["config"]["stats"]["min_effect_pct"] = 0.7
    (a / "manifest.json").write_text(json.dumps(m))
    b = RESULTS / "h200-neighbour-tp1"
    rc, said = _compare(capsys, a, b, "--force", "--run-sd", "0")
    assert rc == compare.CANNOT_DECIDE
    assert (
        "widened at 8192: inconclusive: +0.6 % (0.2 to 1.0), below the 0.7 % minimum effect (significant, but "
        "not shown within +-0.7 %)" in said
    )
    assert "widened at 8192: inconclusive: with" not in said  # not explained as a lack of power
    rc, said = _compare(capsys, a, b, "--force")
    assert rc == compare.CANNOT_DECIDE and "widened at 8192: inconclusive: with 3 + 2 servers" in said
    assert "a run-to-run sd of" in said and "is assumed, not measured" in said


def test_history_cannot_tell_a_noisy_series_and_holds_a_tight_one(capsys, tmp_path):
    noisy, tight = tmp_path / "noisy", tmp_path / "tight"
    for i, v in enumerate(("0.26.0", "0.27.1", "0.28.0")):
        make_run(noisy / f"r{i}", {"stock": 2.0}, vllm=v, seed=i, between=0.15, depths=(1024,))
        make_run(tight / f"r{i}", {"stock": 2.0}, vllm=v, seed=i, between=0.001, depths=(1024,), passes=4)
    rc, said = _history(capsys, noisy, "--out", str(tmp_path / "h1"))
    assert rc == 3 and "cannot tell between #" in said and "sign-off" not in said
    j = json.loads((tmp_path / "h1" / "history.json").read_text())
    assert j["change_points"] == [] and j["series"][0]["decision"] == verdicts.INCONCLUSIVE
    rc, said = _history(capsys, noisy, "--out", str(tmp_path / "h2"), "--allow-inconclusive")
    assert rc == 0 and "exit status 0: done: no slower step; stretches it cannot tell allowed" in said
    rc, said = _history(capsys, tight, "--out", str(tmp_path / "h3"))
    assert rc == 0 and "no change point; every split tested within the min effect" in said
    assert json.loads((tmp_path / "h3" / "history.json").read_text())["series"][0]["decision"] == verdicts.EQUIVALENT


def test_history_counts_each_run_once(capsys, tmp_path):
    """A `latest` link to a run, and a copy of one, are the same run: counted twice, a 3 % step
    between two runs of two servers each reads as a step of four servers against two."""
    runs = tmp_path / "results"
    make_run(runs / "a", {"stock": 2.0}, vllm="0.26.0", seed=1, between=0.004, depths=(1024,))
    make_run(runs / "b", {"stock": 2.06}, vllm="0.27.1", seed=2, between=0.004, depths=(1024,))
    alone = _history(capsys, runs, "--out", str(tmp_path / "h0"))
    (runs / "latest").symlink_to("b")
    shutil.copytree(runs / "b", runs / "b-copy")
    loaded, skipped = history_runs.read_runs(runs, "version")
    assert [r.root.name for r in loaded] == ["a", "b"]
    assert skipped == [
        "skipped b-copy: the same run as b (its manifest's run id and start)",
        "skipped latest: the same folder as b (a link to it)",
    ]
    rc, said = _history(capsys, runs, "--out", str(tmp_path / "h1"))
    assert rc == alone[0] and "warning: skipped latest: the same folder as b" in said
    j0, j1 = (json.loads((tmp_path / h / "history.json").read_text()) for h in ("h0", "h1"))
    assert j1["series"] == j0["series"] and j1["change_points"] == j0["change_points"]


def _planted(root, **kw):
    """A run whose manifest strings and folder path hold rich markup."""
    run = make_run(root, {"stock": 2.0, "widened": 2.0}, seed=3, between=0.003, **kw)
    m = json.loads((run / "manifest.json").read_text())
    m["model"]["path"] = "/models/[/x]"
    for arm in m["arms"].values():
        arm["installation"]["vllm"] += "[/x]"
    m["git"] = {"commit": "[/x][bold]", "dirty": True}
    (run / "manifest.json").write_text(json.dumps(m))
    return run


def test_markup_in_manifests_and_paths_is_printed_not_read(capsys, tmp_path):
    a = _planted(tmp_path / "runs[/x]" / "a[b]", vllm="0.26.0")
    b = _planted(tmp_path / "runs[/x]" / "b[bold]", vllm="0.27.1", started="2026-11-30T10:00:00")
    rc, said = _compare(capsys, a, b, "--allow-inconclusive")
    assert rc in (0, 3) and "(vLLM 0.27.1[/x])" in said and "CODE NOT IDENTIFIED in a[b]: commit `[/x][bold]`" in said
    rc, said = _history(capsys, tmp_path / "runs[/x]", "--out", str(tmp_path / "out[/x]"))
    # the title wraps at the table's width, wherever the temporary folder is: compared without spaces
    title = f"history of {tmp_path / 'runs[/x]'} (by version): 2 runs".replace(" ", "")
    assert rc in (0, 3) and title in said.replace(" ", "") and "b[bold]" in said
    assert main(["report", str(b)]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "widened / stock" in said and f"in {b}" in said
    assert main(["report", "--pr", str(b)]) == 0
    assert "`/models/[/x]`" in capsys.readouterr().out


def test_compare_aligns_the_two_runs_per_arm_and_point_not_whole_runs(capsys):
    """h200-reference-tp1 is on the plain client estimate at 32K only (its prefill guard, one
    estimator per point); compared with h200-precision-tp1 (corrected everywhere), both runs' 32K rows
    go to the plain estimate and every other row keeps the corrected one (the whole runs had gone to
    the plain one)."""
    ref, prec = RESULTS / "h200-reference-tp1", RESULTS / "h200-precision-tp1"
    _, said = _compare(capsys, ref, prec, "--force")  # forced: their min effects differ
    assert "the runs' estimators differ at rocm-attn at 32768, stock at 32768, widened at 32768" in said
    at32 = {(a, Point(32768)) for a in ("stock", "widened", "rocm-attn")}
    assert RunAnalysis(ref).on_client() == at32 and RunAnalysis(prec).on_client() == set()
    both = RunAnalysis(prec, client_at=at32)  # what compare builds for run B
    on = {(r["arm"], r["depth"]): r["estimator"] for r in both.estimator_by_point}
    assert on[("stock", 32768)] == on[("widened", 32768)] == "client"
    assert on[("stock", 1024)] == on[("widened", 8192)] == "prefill-corrected"
