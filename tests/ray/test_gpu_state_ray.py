"""--executor ray: each task runs the GPU checks on its own node, and a slot whose GPU holds another
process before a server starts is skipped, reported, and its cells go to another slot.

Two Ray nodes on this host, each given the FAKE NVML (tests/support/fake_nvml.py, through E2E_FAKE_NVML in
the node's environment: no GPU fault can be produced on this CPU machine); one node's GPU shows a
foreign process throughout. The server is the executors' stand-in (tests/support/executor_standin.py)."""

from __future__ import annotations

import json

import pytest

from e2e.rundir.store import read_jsonl
from tests.support import ROOT
from tests.support.executor_standin import cluster, harness, manifest, standin, standin_cfg  # noqa: F401

pytest.importorskip("ray")
# Its own two-node cluster (~40 s here): beyond CI's budget beside the other Ray tests. The driver's
# decision alone is tested fast in tests/unit/gpu/test_gpu_state.py (test_a_busy_slot_hands_its_groups_to_other_slots).
pytestmark = pytest.mark.slow
FAKE = str(ROOT / "tests" / "support" / "fake_nvml.py")


def test_a_slot_whose_gpu_is_held_is_skipped_and_its_cells_run_on_another(tmp_path, standin):  # noqa: F811
    run_dir = tmp_path / "g"
    scripts = []
    for name, events in (("busy", [{"foreign": [{"pid": 4_000_000, "used_mib": 4096}]}]), ("clean", [])):
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps({"events": events}))
        scripts.append({"E2E_FAKE_NVML": FAKE, "E2E_FAKE_NVML_SCRIPT": str(p)})
    c, nodes = cluster(envs=tuple(scripts))
    try:
        cfg = standin_cfg(tmp_path / "c.toml", standin, run={"passes": 1})
        p = harness(
            "--config",
            str(cfg),
            "--out",
            str(tmp_path),
            "--run-id",
            "g",
            "--no-progress",
            "--executor",
            "ray",
            "--ray-address",
            c.address,
            "--max-per-host",
            "2",
        )
        out = p.communicate(timeout=300)[0]
        assert p.returncode == 0, out
        slots = manifest(run_dir)["executors"][-1]["slots"]
        busy = next(s["name"] for s in slots if s["node_id"] == nodes[0].node_id)
        clean = next(s["name"] for s in slots if s["node_id"] == nodes[1].node_id)
        assert f"slot {busy} (" in out and "skipped: GPU 0: pid 4000000 (not visible here, 4096 MiB)" in out, out
        cells = read_jsonl(run_dir / "cells.jsonl")
        assert sorted(x["cell_id"] for x in cells) == ["p1-d16-a", "p1-d16-b"]
        for x in cells:  # both on the clean slot, checked there, and no attempt spent on the busy one
            assert x["status"] == "ok" and x["slot"] == clean and x["attempt"].startswith("0-"), x
            g = x["gpu_state"]
            assert g["available"] and g["own_seen"] and not g["contaminated"] and not g["pre_start_foreign"], g
            samples = run_dir / "cells" / x["server_key"] / "gpu-a0" / "samples.jsonl"
            assert samples.is_file()  # the node's readings came back with its files
    finally:
        c.shutdown()
