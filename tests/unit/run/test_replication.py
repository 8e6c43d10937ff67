"""Adaptive replication (run.target_ci_pct), two stages: the planned passes are a pilot, then one
allocation (extra passes, rounds per depth) chosen from the pilot's variance model and measured
costs runs, counterbalanced, within the pass and time budget. The loop is session's own; only the
cells' measurement is simulated (rows as the runner writes them: each server off by a lognormal
between-server spread, its cell honouring the rounds the plan gave it), because what is under test
is the decision on the rows."""

from __future__ import annotations

import json

import numpy as np
import pytest

from e2e.design.config import parse_config
from e2e.design.plan import make_plan
from e2e.report.progress import make_console
from e2e.run import runner, session
from e2e.rundir.formats import cell_row, request_row
from e2e.rundir.store import CELLS, REQUESTS, RunStore


def fake_runner(spread: float, seed: int = 0):
    rng = np.random.default_rng(seed)

    class Runner:
        def __init__(self, cfg, store, cells, progress, sampler, stop_rule_factory=None):
            self.cfg, self.store, self.cells = cfg, store, cells

        def run(self):
            done = self.store.finished_cell_ids()
            for c in [c for c in self.cells if c.cell_id not in done]:
                tpt = 0.010 * float(np.exp(rng.normal(0, spread)))  # this server's per-token cost
                base = dict(cell_id=c.cell_id, attempt="0-x", pass_=c.pass_, arm=c.arm, depth=c.depth)
                rounds = c.rounds or self.cfg.workload.rounds
                for r in range(rounds):
                    for n in (64, 8):
                        t = 0.05 + n * tpt * float(np.exp(rng.normal(0, 0.01)))
                        self.store.append(REQUESTS, request_row(**base, n_tokens=n, round=r, t_client_s=t, valid=True))
                self.store.append(
                    CELLS,
                    cell_row(
                        **base,
                        status="ok",
                        index=c.index,
                        server_key=c.server_key,
                        startup_s=90.0,
                        warmup_s=1.0,
                        measure_s=0.8 * rounds,
                        rounds=rounds,
                    ),
                )
            return []

    return Runner


def run(tmp_path, monkeypatch, spread, target=2.0, max_passes=6):
    cfg = parse_config(
        {
            "name": "rep",
            "model": {"path": "m", "vocab_size": 1000},
            "workload": {"depths": [64], "rounds": 6},
            "run": {"order": "both", "passes": 2, "target_ci_pct": target, "max_passes": max_passes},
            "gsm8k": {"enabled": False},
            "stats": {"measure_bandwidth": False},
            "arms": [{"name": "a"}, {"name": "b"}],
        }
    )
    monkeypatch.setattr(runner, "Runner", fake_runner(spread))  # what the local executor runs
    cells = make_plan(cfg)
    store = RunStore.create(tmp_path / "r")
    with store:
        store.write_manifest(
            {"schema_version": 1, "run_id": "r", "status": "running", "config": cfg.model_dump(mode="json")}
        )
        store.write_plan([c.to_dict() for c in cells])
        rc = session.execute(cfg, store, cells, make_console(), session.Options(progress=False), None)
    return (
        rc,
        json.loads((tmp_path / "r" / "manifest.json").read_text()),
        json.loads((tmp_path / "r" / "plan.json").read_text()),
    )


def test_a_pilot_within_the_target_still_runs_the_second_stages_minimum(tmp_path, monkeypatch):
    # stopping at a pilot that looked narrow enough is a stop on the data (it covered 82.5 % in a
    # harder simulated regime): the second stage always runs, at its least (one pass, fewest rounds)
    rc, m, plan = run(tmp_path, monkeypatch, spread=0.002, target=5.0)
    rep = m["replication"]
    assert rc == 0 and rep["stopped_by"].startswith("target reached by the pilot: the second stage runs")
    assert rep["extra_passes"] == 1 and rep["rounds"]["64"] == 5 and max(c["pass"] for c in plan) == 3
    assert rep["pilot_widest_ci_half_width_pct"] <= 5.0 and rep["target_met"] is True


def test_the_allocation_from_the_pilot_runs_once_and_records_its_choice(tmp_path, monkeypatch):
    rc, m, plan = run(tmp_path, monkeypatch, spread=0.01, target=1.5, max_passes=10)
    rep = m["replication"]
    assert rep["rule"].startswith("two-stage") and rep["extra_passes"] >= 1
    assert rep["passes"] == 2 + rep["extra_passes"] == max(c["pass"] for c in plan)
    assert rep["costs"]["start_s"] == {"a": 90.0, "b": 90.0} and rep["costs"]["round_s"]["a@64"] == pytest.approx(0.8)
    chosen = rep["rounds"]["64"]
    assert all(c.get("rounds") == chosen for c in plan if c["pass"] > 2)  # the new cells' own rounds
    assert all("rounds" not in c for c in plan if c["pass"] <= 2)
    assert rep["allocation"]["predicted_gpu_minutes"] > 0 and "widest_ci_half_width_pct" in rep
    leads = [next(c["arm"] for c in plan if c["pass"] == p) for p in range(1, rep["passes"] + 1)]
    assert leads == ["a", "b"] * (len(leads) // 2) + ["a"] * (len(leads) % 2)  # counterbalanced as added
    assert [c["index"] for c in plan] == list(range(len(plan)))
    report = (tmp_path / "r" / "report.md").read_text()
    assert "adaptive, two stages" in report and f"{rep['extra_passes']} more pass(es)" in report
    # the manifest names the estimator that decided (these rows have no server prefill time)
    assert m["estimator"]["name"] == "client" and "no round with both server prefill times" in m["estimator"]["why"]


def test_loose_servers_spend_the_pass_budget(tmp_path, monkeypatch):
    rc, m, plan = run(tmp_path, monkeypatch, spread=0.20, target=0.5, max_passes=5)
    rep = m["replication"]
    assert rep["stopped_by"].startswith("the allocation capped") and rep["passes"] == 5
    assert rep["target_met"] is False
    assert "target not met" in (tmp_path / "r" / "report.md").read_text()


@pytest.mark.parametrize("passes", [None, 1])
def test_adaptive_replication_starts_from_two_passes(passes):
    cfg = parse_config(
        {
            "model": {"path": "m"},
            "workload": {"depths": [64]},
            "arms": [{"name": "a"}],
            "run": {"target_ci_pct": 1.0, **({"passes": passes} if passes else {})},
        }
    )
    assert cfg.default_passes() == (4 if passes is None else 2)
