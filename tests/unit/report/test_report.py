"""Reports, compare and history on run folders built with e2e.rundir.store from constructed rows."""

from __future__ import annotations

import argparse
import csv
import json

import pytest

from e2e.cli.commands.compare import Compare
from e2e.cli.commands.history import History as HistoryCommand
from e2e.errors import UserError
from e2e.report import compare, history, history_runs
from e2e.report import write as report
from e2e.rundir.store import CELLS, RunStore
from e2e.stats import verdicts
from tests.support import ROOT
from tests.support.synthetic import make_run


def test_write_report_files_and_decisions(tmp_path):
    run = make_run(tmp_path / "r1", {"stock": 2.0, "widened": 2.4}, dead_attempt="p1-d1024-stock")
    paths = report.write_report(run)
    assert {p.name for p in paths} == set(report.FILES)
    s = json.loads((run / "summary.json").read_text())
    assert s["schema_version"] == report.SCHEMA_VERSION
    pooled = [c for c in s["comparisons"] if c["scope"] == "pooled"]
    assert [c["depth"] for c in pooled] == [1024, 8192]
    assert all(c["decision"] == "slower" and c["ratio"] == pytest.approx(1.2, rel=0.05) for c in pooled)
    assert all(c["diff_ms"] > 0 for c in pooled)
    assert len([c for c in s["comparisons"] if c["scope"] == "pass"]) == 4
    # the dead attempt's 99 s rows did not count
    cell = next(c for c in s["cells"] if c["cell_id"] == "p1-d1024-stock")
    assert cell["estimate_ms"] == pytest.approx(2.0, rel=0.05) and cell["n_rounds"] == 6
    with open(run / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 8 and all(r["schema_version"] == str(report.SCHEMA_VERSION) for r in rows)
    md = (run / "report.md").read_text()
    for needle in (
        "0.26.0",
        "NVIDIA H200",
        "gemma-3-27b-it-w4a16",
        "| tensor parallel | 2 |",
        "torch.compile + CUDA graphs",
        "**slower**",
        "| `TritonAttentionImpl h128` | forward:TritonAttentionImpl | 10 |",
        f"schema_version {report.SCHEMA_VERSION}",
        "At most",
        "Floor unavailable: the run folder keeps no model/config.json",
    ):
        assert needle in md, needle
    assert "RANDOM-WEIGHT TWIN" not in md


def test_aa_run_with_tight_servers_is_equivalent(tmp_path):
    """Identical arms, four servers each within 0.3 %: the 90 % interval sits inside +-2 %. (With
    two servers each, df 2, it need not: the same rows then read "inconclusive" at some depth.)"""
    run = make_run(tmp_path / "aa", {"a": 2.0, "b": 2.0}, seed=3, between=0.003, passes=4)
    a = report.RunAnalysis(run)
    pooled = [c for c in a.comparisons if c["scope"] == "pooled"]
    assert all(c["decision"] == verdicts.EQUIVALENT for c in pooled)
    assert "Holm" in a.correction and all(c["p_adjusted"] >= c["p_value"] for c in pooled)


def test_failed_missing_one_pass_and_three_arms(tmp_path):
    run = make_run(
        tmp_path / "r",
        {"ref": 2.0, "x": 2.0, "y": 3.0},
        passes=1,
        between=0.002,
        failed={"p1-d1024-x"},
        missing={"p1-d8192-y"},
    )
    report.write_report(run)
    s = json.loads((run / "summary.json").read_text())
    pooled = {(c["arm"], c["depth"]): c for c in s["comparisons"] if c["scope"] == "pooled"}
    assert pooled[("x", 1024)]["decision"] == verdicts.NODATA  # its only cell failed
    assert pooled[("y", 8192)]["decision"] == verdicts.NODATA  # never ran
    # one server per arm: a 50 % slower arm is still not decided from one server each
    assert pooled[("y", 1024)]["decision"] == verdicts.INSUFFICIENT_REPLICATION
    assert pooled[("y", 1024)]["ratio"] == pytest.approx(1.5, rel=0.02)
    assert pooled[("y", 1024)]["ci_kind"] == verdicts.WITHIN
    assert pooled[("x", 8192)]["decision"] == verdicts.INSUFFICIENT_REPLICATION
    assert any("1 server in an arm" in w for w in pooled[("y", 1024)]["warnings"])
    assert any("p1-d1024-x: cell failed" in w for w in s["warnings"])
    assert any("not run: p1-d8192-y" in w for w in s["warnings"])
    assert s["max_pass_disagreement_pct"] is None
    statuses = {c["cell_id"]: c["status"] for c in s["cells"]}
    assert statuses["p1-d1024-x"] == "failed" and statuses["p1-d8192-y"] == "not run"
    md = (run / "report.md").read_text()
    assert "One pass only" in md and "- p1-d1024-x: cell failed" in md


def test_twin_gsm8k_and_roofline_with_a_model_folder(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "num_hidden_layers": 2,
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 16,
                "vocab_size": 1000,
                "model_type": "llama",
            }
        )
    )
    run = make_run(tmp_path / "r", {"stock": 2.0}, model=str(model), twin_of="google/gemma-3-27b-it")
    (run / "gsm8k").mkdir()
    # the committed demo's sign-off summary: report.md shows it as tables, never as a JSON dump
    (run / "gsm8k" / "summary.json").write_bytes((ROOT / "results/cpu-demo/gsm8k/summary.json").read_bytes())
    report.write_report(run)
    md = (run / "report.md").read_text()
    assert "RANDOM-WEIGHT TWIN" in md and "google/gemma-3-27b-it" in md
    assert "**Verdict: inconclusive**" in md and "```" not in md
    assert (
        "| AB: stock/r1 vs widened/r1 | gsm8k_cot_offline / strict-match (primary) | 10 | 0.0 | 0.0 | "
        "+0.0 [-27.8, +27.8] | +27.1 | 0 | 0 | 1 | 0 | inconclusive |"
    ) in md
    s = json.loads((run / "summary.json").read_text())
    rf = s["roofline"]
    assert rf["available"] and rf["bandwidth_gbps"] == 4800
    floor = rf["per_depth"]["1024"]["floor_ms"]
    est = next(c["estimate_ms"] for c in s["cells"] if c["cell_id"] == "p1-d1024-stock")
    assert rf["per_depth"]["1024"]["measured_over_floor"]["stock"][0] == pytest.approx(est / floor)
    assert rf["measured_bandwidth_gbps"] is None  # the manifest has no measurement
    # A run whose manifest carries the measured read bandwidth gets the second floor too.
    m = json.loads((run / "manifest.json").read_text())
    m["gpu_bandwidth"] = {"available": True, "best_gbps": 4000.0, "median_gbps": 3990.0}
    (run / "manifest.json").write_text(json.dumps(m))
    report.write_report(run)
    rf = json.loads((run / "summary.json").read_text())["roofline"]
    e = rf["per_depth"]["1024"]
    assert rf["measured_bandwidth_gbps"] == 4000.0 and e["floor_measured_ms"] == pytest.approx(floor * 4800 / 4000)
    assert e["measured_over_measured_floor"]["stock"][0] == pytest.approx(est / e["floor_measured_ms"])
    assert "4000 GB/s measured in this run (83% of the datasheet" in (run / "report.md").read_text()


def test_the_floor_survives_without_the_model_folder(tmp_path):
    """The run folder keeps the model's config.json, so a report made where the model is not (the
    GPU machine's /tmp is gone) still has the geometry and the floor."""
    import shutil

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps(
            {
                "num_hidden_layers": 2,
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "head_dim": 16,
                "vocab_size": 1000,
                "model_type": "llama",
            }
        )
    )
    run = make_run(tmp_path / "r", {"stock": 2.0}, model=str(model))
    with RunStore(run) as store:
        store.save_model_config(str(model))
    shutil.rmtree(model)
    report.write_report(run)
    assert json.loads((run / "summary.json").read_text())["roofline"]["available"]


def test_start_phases_table_from_the_cells_rows(tmp_path):
    """Each start's phases (from its log, in the cell row) reach summary.json and report.md; a cell
    without phases (a shared server's later cell, an old run) is left out, not shown as zeros."""
    root = make_run(tmp_path / "r", {"stock": 10.0, "widened": 10.0}, depths=(1024,), passes=1)
    rows = [json.loads(x) for x in (root / CELLS).read_text().splitlines()]
    rows[0]["startup_phases"] = {
        "total_logged_s": 70.0,
        "compile_s": 54.0,
        "compile_cache": "miss",
        "graph_capture_s": 9.0,
        "weights_s": 5.0,
    }
    (root / CELLS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    report.write_report(root)
    s = json.loads((root / "summary.json").read_text())
    (ph,) = s["start_phases"]
    assert ph["cell_id"] == rows[0]["cell_id"] and ph["before_log_s"] == pytest.approx(100.0 - 70.0)
    md = (root / "report.md").read_text()
    assert f"| {rows[0]['cell_id']} | 100.0 | 30.0 | - | - | 5.0 | 54.0 | miss | 9.0 | - | - |" in md


def test_report_main_and_bad_folder(tmp_path, capsys):
    from e2e.cli import main

    run = make_run(tmp_path / "r", {"stock": 2.0, "widened": 2.0})
    assert main(["report", str(run)]) == 0
    assert "report.md" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "not a run folder" in capsys.readouterr().err


def _compare(a, b, *extra):
    p = argparse.ArgumentParser()
    Compare().add_arguments(p)
    return Compare().run(p.parse_args([str(a), str(b), *extra]))


def test_compare_exit_status(tmp_path):
    a = make_run(tmp_path / "a", {"stock": 2.0, "widened": 1.8}, seed=1, between=0.003, passes=4)
    same = make_run(tmp_path / "same", {"stock": 2.0, "widened": 1.8}, seed=2, between=0.003, passes=4)
    slow = make_run(tmp_path / "slow", {"stock": 2.3, "widened": 1.8}, seed=3, between=0.003, passes=4)
    fast = make_run(tmp_path / "fast", {"stock": 1.7, "widened": 1.8}, seed=4, between=0.003, passes=4)
    assert _compare(a, same) == 0
    assert _compare(a, fast) == 0
    out = tmp_path / "cmp.json"
    assert _compare(a, slow, "--json", str(out)) == 1
    j = json.loads(out.read_text())
    assert j["schema_version"] == 4 and j["regressions"] == 2 and j["exit_status"] == 1 and j["unfinished"] == []
    decided = {(r["arm"], r["decision"]) for r in j["rows"]}
    assert decided == {("stock", "slower"), ("widened", verdicts.EQUIVALENT)}
    assert "Holm" in j["correction"]
    assert _compare(a, slow, "--arm", "widened") == 0
    with pytest.raises(UserError, match="not in both runs"):
        _compare(a, slow, "--arm", "nope")


def test_compare_cannot_decide_exits_3(tmp_path):
    """One server per arm, an arm missing from B, or B without valid cells: exit 3, never 0."""
    a = make_run(tmp_path / "a", {"stock": 2.0, "widened": 1.8}, seed=1, between=0.003)
    one = make_run(tmp_path / "one", {"stock": 2.0, "widened": 1.8}, passes=1, seed=2)
    assert _compare(a, one) == compare.CANNOT_DECIDE
    only_stock = make_run(tmp_path / "only", {"stock": 2.0}, seed=3, between=0.003)
    assert _compare(a, only_stock) == compare.CANNOT_DECIDE  # widened is missing from B
    cells = make_run(
        tmp_path / "failed",
        {"stock": 2.0, "widened": 1.8},
        seed=4,
        failed={
            "p1-d1024-stock",
            "p1-d1024-widened",
            "p1-d8192-stock",
            "p1-d8192-widened",
            "p2-d1024-stock",
            "p2-d1024-widened",
            "p2-d8192-stock",
            "p2-d8192-widened",
        },
    )
    assert _compare(a, cells) == compare.CANNOT_DECIDE


def _cut_short(root, status="running"):
    """A run whose machine went away: the manifest says `running` (nobody holds its lock, so readers
    say harness-died) and pass 2's stock cells never ran."""
    m = json.loads((root / "manifest.json").read_text())
    m["status"] = status
    (root / "manifest.json").write_text(json.dumps(m))
    rows = [json.loads(x) for x in (root / CELLS).read_text().splitlines()]
    (root / CELLS).write_text(
        "".join(json.dumps(r) + "\n" for r in rows if not (r["pass"] == 2 and r["arm"] == "stock"))
    )


def test_compare_and_history_name_an_unfinished_run(tmp_path, capsys):
    """Rows of a run that stopped short still compare, but never silently: both commands print
    which run is not finished, its status and the planned cells it lacks, and write them to JSON."""
    runs = tmp_path / "runs"
    a = make_run(runs / "a", {"stock": 2.0, "widened": 1.8}, seed=1, between=0.003, passes=4)
    b = make_run(
        runs / "b",
        {"stock": 2.0, "widened": 1.8},
        seed=2,
        between=0.003,
        passes=4,
        vllm="0.27.1",
        started="2026-11-30T10:00:00",
    )
    make_run(runs / "c", {"stock": 2.0}, seed=3, between=0.003, vllm="0.28.0")
    _cut_short(b)
    out = tmp_path / "cmp.json"
    assert _compare(a, b, "--json", str(out)) == 0  # widened and stock still have 2+ servers a side
    printed = " ".join(capsys.readouterr().out.split())
    assert (
        "RUN NOT FINISHED: b is not finished (status harness-died): 2 of 16 planned cell(s) not run "
        "(p2-d1024-stock, p2-d8192-stock)" in printed
    )
    assert json.loads(out.read_text())["unfinished"] == [
        "b is not finished (status harness-died): 2 of 16 planned cell(s) not run (p2-d1024-stock, p2-d8192-stock)"
    ]
    assert _compare(a, make_run(runs / "d", {"stock": 2.0, "widened": 1.8}, seed=4, passes=4)) == 0
    assert "NOT FINISHED" not in capsys.readouterr().out
    p = argparse.ArgumentParser()
    HistoryCommand().add_arguments(p)
    h = tmp_path / "h"
    assert HistoryCommand().run(p.parse_args([str(runs), "--match", "a", "--match", "b", "--out", str(h)])) == 0
    assert "RUN NOT FINISHED: b is not finished" in " ".join(capsys.readouterr().out.split())
    j = json.loads((h / "history.json").read_text())
    assert j["schema_version"] == 4
    assert {r["run"] for r in j["runs"]} == {"a", "b"} and len(j["unfinished"]) == 1  # c and d: not matched
    assert {(r["run"], r["finished"]) for r in j["runs"]} == {("a", True), ("b", False)}
    with open(h / "history.csv") as f:
        assert {(r["run"], r["finished"]) for r in csv.DictReader(f)} == {("a", "True"), ("b", "False")}


def test_compare_refuses_mismatched_metadata_unless_forced(tmp_path):
    a = make_run(tmp_path / "a", {"stock": 2.0})
    b = make_run(tmp_path / "b", {"stock": 2.0}, depths=(1024, 4096), seed=5)
    c = make_run(tmp_path / "c", {"stock": 2.0}, model="other-model", seed=6)
    with pytest.raises(UserError, match="depths"):
        _compare(a, b)
    with pytest.raises(UserError, match="model"):
        _compare(a, c)
    assert _compare(a, b, "--force") in (0, compare.CANNOT_DECIDE)  # only the common depth 1024
    m = json.loads((b / "manifest.json").read_text())
    m["config"]["stats"] = {"alpha": 0.01, "min_effect_pct": 5.0}
    (b / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(UserError, match="alpha: 0.05 vs 0.01.*min_effect_pct: 2.0 vs 5.0"):
        _compare(a, b)


def test_history_orders_by_version_and_finds_the_step(tmp_path, capsys):
    runs = tmp_path / "runs"
    make_run(runs / "z-new", {"stock": 2.5}, vllm="0.27.1", started="2026-11-01T00:00:00", seed=1, between=0.003)
    make_run(runs / "a-old", {"stock": 2.0}, vllm="0.9.2", started="2026-12-01T00:00:00", seed=2, between=0.003)
    make_run(runs / "m-mid", {"stock": 2.0}, vllm="0.26.0", started="2026-10-01T00:00:00", seed=3, between=0.003)
    make_run(runs / "b-newer", {"stock": 2.5}, vllm="0.28.0", started="2026-10-15T00:00:00", seed=4, between=0.003)
    loaded, skipped = history_runs.read_runs(runs, "version")
    h = history.history(loaded)
    rows, steps = h.rows, h.steps
    order = [r["run"] for r in rows if r["depth"] == 1024]
    # 0.9.2 < 0.26.0 < 0.27.1 < 0.28.0, not string order; two runs a side: run-to-run variation is estimable
    assert order == ["a-old", "m-mid", "z-new", "b-newer"] and not skipped
    assert [(s["depth"], s["after_run"], s["first_run"], s["decision"]) for s in steps] == [
        (1024, "m-mid", "z-new", verdicts.SLOWER),
        (8192, "m-mid", "z-new", verdicts.SLOWER),
    ]
    by_date = [r.root.name for r in history_runs.read_runs(runs, "date")[0]]
    assert by_date == ["m-mid", "b-newer", "z-new", "a-old"]
    (runs / "broken").mkdir()
    (runs / "broken" / "manifest.json").write_text("{not json")
    (runs / "broken" / "plan.json").write_text("[]")
    p = argparse.ArgumentParser()
    HistoryCommand().add_arguments(p)
    assert HistoryCommand().run(p.parse_args([str(runs), "--out", str(tmp_path / "h")])) == 1  # a slower step
    out = " ".join(capsys.readouterr().out.split())
    assert "skipped broken" in out
    for d in (1024, 8192):  # each step named by its runs' numbers in the runs table
        assert f"stock at {d} (series 0): slower step between #1 and #2: ratio 1.2" in out
    assert (tmp_path / "h" / "history.png").stat().st_size > 0
    with open(tmp_path / "h" / "history.csv") as f:
        assert len(list(csv.DictReader(f))) == 8
    assert len(json.loads((tmp_path / "h" / "history.json").read_text())["change_points"]) == 2
    with pytest.raises(UserError, match="no run folders"):
        history_runs.find_runs(tmp_path / "h")
    assert [p.name for p in history_runs.find_runs(runs, "*-mid")] == ["m-mid"]  # --match GLOB


def test_version_order_is_numeric_and_release_after_rc():
    vs = ["0.27.1", "0.9.2", "0.26.0", "0.26.0rc1", None, "0.10.1+cpu"]
    assert sorted(vs, key=history_runs.version_key) == ["0.9.2", "0.10.1+cpu", "0.26.0rc1", "0.26.0", "0.27.1", None]


def test_routing_summary_per_arm_and_layer_class(tmp_path):
    """The run's summary says, per arm and layer class, which path it took and in which processes;
    cells that disagree for one arm show as separate rows (never merged into one answer)."""
    root = make_run(tmp_path / "r", {"stock": 10.0, "widened": 10.0}, depths=(1024,), passes=1)

    def rec(path, n):
        return {
            "layer_classes": [
                {
                    "layer_class": "RocmAttentionImpl h128 q16/kv8 sw- bs16",
                    "n_layers": n,
                    "path": path,
                    "processes": ["Worker rank 0 pid 1", "Worker rank 1 pid 2"],
                }
            ],
            "gate": [
                {
                    "gqa_ratio": 2,
                    "head_size": 128,
                    "block_size": 16,
                    "sliding_window": 0,
                    "answer": path == "rocm_custom_op",
                    "processes": ["Worker rank 0 pid 1"],
                }
            ],
            "cudagraph_modes": ["FULL_AND_PIECEWISE"],
        }

    rows = [json.loads(x) for x in (root / CELLS).read_text().splitlines()]
    rows[0]["routing"] = rec("triton_paged_attention_2d", 10)
    rows[1]["routing"] = rec("rocm_custom_op", 10)
    (root / CELLS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    report.write_report(root)
    s = json.loads((root / "summary.json").read_text())
    layers = {(r["arm"], r["path"]): r for r in s["routing"] if r["kind"] == "layer class"}
    assert set(layers) == {("stock", "triton_paged_attention_2d"), ("widened", "rocm_custom_op")}
    assert layers[("widened", "rocm_custom_op")]["processes"] == ["Worker rank 0", "Worker rank 1"]
    gates = {(r["arm"], r["path"]) for r in s["routing"] if r["kind"] == "gate"}
    assert gates == {("stock", "answer False"), ("widened", "answer True")}
    md = (root / "report.md").read_text()
    assert "| widened | `RocmAttentionImpl h128 q16/kv8 sw- bs16` | rocm_custom_op | 10 |" in md


def test_a_non_stationary_server_widens_its_comparison_and_is_named(tmp_path):
    """A server whose bookend stepped (e2e/stats/bookends.py) is never averaged in silently: the comparison
    names it, the run warns, and its cells carry the drift as extra variance in the model (so the
    interval widens and the server weighs less)."""
    from e2e.analysis.run_analysis import RunAnalysis

    step = {"status": "non-stationary", "step_pct": 8.0, "p_value": 0.004, "test": "Mann-Whitney U"}
    clean = RunAnalysis(make_run(tmp_path / "a", {"stock": 2.0, "widened": 2.0}, between=0.002, seed=3))
    drift = RunAnalysis(
        make_run(
            tmp_path / "b",
            {"stock": 2.0, "widened": 2.0},
            between=0.002,
            seed=3,
            row_extra={"p1-d1024-widened": {"bookend": step}},
        )
    )
    pick = lambda a: next(c for c in a.comparisons if c["scope"] == "pooled" and c["depth"] == 1024)
    c0, c1 = pick(clean), pick(drift)
    assert c0["non_stationary_servers"] == [] and len(c1["non_stationary_servers"]) == 1
    assert c1["se_log"] > 1.2 * c0["se_log"]  # its drift is in the variance
    assert c1["ratio"] == pytest.approx(c0["ratio"], rel=0.01)  # and it weighs less in the mean
    assert any("non-stationary" in w and "+8.0 %" in w for w in drift.warnings)
