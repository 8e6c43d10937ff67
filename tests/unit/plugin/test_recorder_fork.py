"""The routing recorder in a process vLLM forks (VLLM_WORKER_MULTIPROC_METHOD=fork, a start-time
lever on CUDA: the engine core is then not a fresh interpreter that re-imports vLLM).

A forked child inherits the parent's plugin state: before the recorder followed forks, the engine
core's counts went into the parent's copy of the recorder, with no flush thread and no exit write,
so its record never appeared. Each case runs the real plugin (register()) in a fresh interpreter over
the stand-in `vllm` package of test_recorder_versions, forks a child the way vLLM does
(multiprocessing's fork context, a named Process), and folds the records with the function a cell uses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from e2e.design.config import ArmCfg
from e2e.plugin import contract as pc
from e2e.rundir import routing
from tests.unit.plugin.test_recorder_versions import FAKE_ATTENTION, NEW_LAYOUT, ROOT, RUNNER_OK, V1_RUNNER, _fake_vllm

# The parent poses as vLLM's API server (register() at start); the child as its engine core, which
# builds the layers and runs the steps. import_first: the parent imports the attention layer's module
# before it forks (as vLLM's model registry may), so the hook the child's layers go through was
# installed in the parent. (A parent that imported a model runner would itself count as serving.)
FORKING_SERVER = """
import importlib, multiprocessing, sys
attn_at, runner_at, import_first = sys.argv[1:]
sys.argv = ["vllm/entrypoints/openai/api_server.py", "--model", "m"]
from e2e.plugin import register, current_recorder
register()
if import_first == "1":
    importlib.import_module(attn_at)

class Cache:
    shape = (2, 16, 3, 64)
    def numel(self): return 1

def engine_core():
    attn = importlib.import_module(attn_at)
    runner = importlib.import_module(runner_at)
    layers = [attn.Attention(f"model.layers.{i}.self_attn") for i in range(3)]
    for step in range(4):
        for l in layers:
            l.impl.forward(l, None, None, None, Cache(), "metadata")
        runner.GPUModelRunner().execute_model()

if __name__ == "__main__":
    p = multiprocessing.get_context("fork").Process(target=engine_core, name="EngineCore_DP0")
    p.start(); p.join()
    assert p.exitcode == 0, p.exitcode
    print("child", p.pid)
    current_recorder().write(final=True)
"""


@pytest.mark.parametrize("import_first", [False, True], ids=["child-imports", "parent-imported"])
def test_a_forked_engine_core_writes_its_own_record(tmp_path, import_first):
    fake = _fake_vllm(tmp_path / "fake", "0.26.0", NEW_LAYOUT, FAKE_ATTENTION, RUNNER_OK)
    records = tmp_path / "records"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(fake), str(ROOT)]),
        pc.ENV_ON: "1",
        pc.ENV_ARM: "stock",
        pc.ENV_RECORD_DIR: str(records),
        pc.ENV_FLUSH_S: "30",
    }
    r = subprocess.run(
        [sys.executable, "-c", FORKING_SERVER, NEW_LAYOUT, V1_RUNNER, "1" if import_first else ""],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    child = int(r.stdout.split()[-1])

    (api_file,) = records.glob("APIServer-*.json")
    files = sorted(p.name for p in records.glob("*.json"))
    assert files == sorted([api_file.name, f"EngineCore-{child}.json"]), files
    core = json.loads((records / f"EngineCore-{child}.json").read_text())
    api = json.loads(api_file.read_text())
    assert api_file.name == f"APIServer-{api['pid']}.json"
    # The child's record is its own, written at its exit (flush every 30 s: only the exit write
    # could have put the final counts there), and it says whom it was forked from.
    assert core["final"] and core["pid"] == child and core["forked_from"] == api["pid"]
    assert core["model_steps"] == 4 and sum(c["n"] for c in core["counts"]) == 12
    assert core["hook_status"]["steps"]["state"] == "found"
    # The parent counted nothing: the child's work never leaks into the API server's record.
    assert api["counts"] == [] and api["model_steps"] == 0 and "forked_from" not in api

    folded = routing.fold_records(records, ArmCfg(name="stock"), wait_s=0)
    assert folded["warnings"] == []
    (lc,) = folded["layer_classes"]
    assert lc["paths"] == {"forward:FakeImpl": 12} and lc["n_layers"] == 3
