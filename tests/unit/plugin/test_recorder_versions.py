"""The routing recorder against vLLM layouts it does not match: the harness must say which hook was
not found on which version, never hand back an empty routing table as if it were a result.

Each case runs the real plugin (register()) in a fresh interpreter posing as a vLLM worker, over a
stand-in `vllm` package laid out like some version; the records it writes are folded by the same
function a cell uses. A live server process that wrote no record is found by its environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from e2e.design.config import ArmCfg
from e2e.plugin import contract as pc
from e2e.rundir import routing
from tests.support import ROOT, vllm_excerpts

FAKE_CONFIG = """
from types import SimpleNamespace as NS
def get_current_vllm_config():
    return NS(cache_config=NS(block_size=16), compilation_config=NS(cudagraph_mode=None, mode=0),
              model_config=NS(enforce_eager=True))
"""
FAKE_PARALLEL = """
from types import SimpleNamespace as NS
def get_tensor_model_parallel_rank(): return 0
def get_tensor_model_parallel_world_size(): return 1
def get_pp_group(): return NS(rank_in_group=0, world_size=1)
"""
# The pieces of an attention layer the recorder reads, and an impl whose forward it counts.
FAKE_ATTENTION = """
class FakeImpl:
    def forward(self, layer, query, key, value, kv_cache, attn_metadata=None):
        return "ran"
class Attention:
    def __init__(self, name):
        self.layer_name, self.head_size, self.num_heads, self.num_kv_heads = name, 64, 9, 3
        self.sliding_window, self.dtype, self.kv_cache_dtype = None, "float32", "auto"
        self.impl = FakeImpl()
"""
RUNNER_OK = "class GPUModelRunner:\n    def execute_model(self):\n        return 1\n"

# What the worker does once the plugin is loaded: build layers, run steps, write its record.
WORKER = """
import multiprocessing, sys
multiprocessing.current_process().name = "VllmWorker-0"
from e2e.plugin import register, current_recorder
register()
import importlib
attn_mod = importlib.import_module(sys.argv[1])
runner = importlib.import_module(sys.argv[2])
class Cache:
    shape = (2, 16, 3, 64)
    def numel(self): return 1
layer = getattr(attn_mod, "Attention", None)
if layer is not None:
    layers = [layer(f"model.layers.{i}.self_attn") for i in range(3)]
    for step in range(4):
        for l in layers:
            l.impl.forward(l, None, None, None, Cache(), "metadata")
        # The runner method the stand-in worker steps through (vLLM's: execute_model).
        step = getattr(runner, "WORKER_CALLS", "execute_model")
        if hasattr(runner.GPUModelRunner, step):
            getattr(runner.GPUModelRunner(), step)()
current_recorder().write(final=True)
"""


V1_RUNNER = "vllm.v1.worker.gpu_model_runner"
V2_RUNNER = "vllm.v1.worker.gpu.model_runner"  # vLLM 0.26 on a GPU ("Using V2 Model Runner")


def _fake_vllm(
    root: Path, version: str, attention_at: str, attention_src: str, runner_src: str, runner_at: str = V1_RUNNER
) -> Path:
    files = {
        "vllm/__init__.py": f"__version__ = {version!r}\n",
        "vllm/config.py": FAKE_CONFIG,
        "vllm/distributed/__init__.py": "",
        "vllm/distributed/parallel_state.py": FAKE_PARALLEL,
        "vllm/v1/__init__.py": "",
        "vllm/v1/worker/__init__.py": "",
        runner_at.replace(".", "/") + ".py": runner_src,
        attention_at.replace(".", "/") + ".py": attention_src,
    }
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        for d in p.relative_to(root).parents:  # every package level needs its __init__
            if str(d) != "." and not (root / d / "__init__.py").exists():
                (root / d / "__init__.py").write_text("")
        p.write_text(text)
    return root


def _serve(
    tmp_path: Path,
    version: str,
    attention_at: str,
    attention_src: str,
    runner_src: str,
    arm: ArmCfg = ArmCfg(name="stock"),
    runner_at: str = V1_RUNNER,
) -> dict:
    fake = _fake_vllm(tmp_path / "fake", version, attention_at, attention_src, runner_src, runner_at)
    records = tmp_path / "records"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(fake), str(ROOT)]),
        pc.ENV_ON: "1",
        pc.ENV_ARM: arm.name,
        pc.ENV_PATCHES: ",".join(arm.patches),
        pc.ENV_RECORD_DIR: str(records),
        pc.ENV_FLUSH_S: "30",
    }
    r = subprocess.run(
        [sys.executable, "-c", WORKER, attention_at, runner_at], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return routing.fold_records(records, arm, wait_s=0)


NEW_LAYOUT = "vllm.model_executor.layers.attention.attention"
OLD_LAYOUT = "vllm.attention.layer"


def test_a_layout_the_recorder_knows_gives_layer_classes_and_no_warning(tmp_path):
    # The Attention layer where older vLLM kept it: found through the target's second candidate.
    folded = _serve(tmp_path, "0.20.0", OLD_LAYOUT, FAKE_ATTENTION, RUNNER_OK)
    assert folded["warnings"] == []
    (lc,) = folded["layer_classes"]
    assert lc["layer_class"] == "FakeImpl h64 q9/kv3 sw- bs16 float32 kv:auto" and lc["n_layers"] == 3
    assert lc["paths"] == {"forward:FakeImpl": 12}
    worker = folded["processes"][0]
    assert worker["serves_model"] and worker["hook_status"]["attention"]["where"] == f"{OLD_LAYOUT}.Attention.__init__"
    assert worker["hook_status"]["steps"]["state"] == "found"


def test_the_v2_model_runner_of_vllm_026_on_a_gpu_is_hooked(tmp_path):
    # The H200 runs of 2026-12-01 warned "hook 'steps' ... not found" on every cell: vLLM 0.26's GPU
    # worker imports only vllm.v1.worker.gpu.model_runner, which the steps target did not list.
    folded = _serve(tmp_path, "0.26.0", NEW_LAYOUT, FAKE_ATTENTION, RUNNER_OK, runner_at=V2_RUNNER)
    assert folded["warnings"] == []
    worker = folded["processes"][0]
    assert worker["hook_status"]["steps"] == {"state": "found", "where": f"{V2_RUNNER}.GPUModelRunner.execute_model"}
    assert worker["model_steps"] == 4 and worker["serves_model"]


def _gpu_layouts() -> list[tuple[str, str, str]]:
    """(release, Attention module, model-runner module) of each carried GPU release, from its source."""
    out = []
    for v in vllm_excerpts.carried():
        rel = vllm_excerpts.Release(v, vllm_excerpts.load(v))
        (attn,) = [p for p in (vllm_excerpts.ATTN_NEW, vllm_excerpts.ATTN_OLD) if rel.get(p, "Attention.__init__")]
        for runner in (V1_RUNNER, V2_RUNNER):
            if rel.get(runner.replace(".", "/") + ".py", "GPUModelRunner.execute_model"):
                out.append((v, attn[:-3].replace("/", "."), runner))
    return out


@pytest.mark.parametrize("version,attention_at,runner_at", _gpu_layouts())
def test_each_gpu_release_layout_gives_complete_records(tmp_path, version, attention_at, runner_at):
    # Where vLLM 0.23.0 / 0.26.0 keep the layer and each of their two GPU runners (read from their
    # source): the recorder finds both and counts every step and every layer's forward.
    folded = _serve(tmp_path, version, attention_at, FAKE_ATTENTION, RUNNER_OK, runner_at=runner_at)
    assert folded["warnings"] == []
    worker = folded["processes"][0]
    assert worker["hook_status"]["steps"] == {"state": "found", "where": f"{runner_at}.GPUModelRunner.execute_model"}
    assert worker["hook_status"]["attention"]["where"] == f"{attention_at}.Attention.__init__"
    assert worker["model_steps"] == 4
    assert folded["layer_classes"][0]["paths"] == {"forward:FakeImpl": 12}


def test_a_steps_hook_that_never_fires_is_named(tmp_path):
    # A release whose worker steps through another method: execute_model exists (hooked) but is
    # never called, so per-step counts would be silently empty.
    runner = (
        "WORKER_CALLS = 'execute_model_async'\nclass GPUModelRunner:\n"
        "    def execute_model(self):\n        return 1\n    def execute_model_async(self):\n        return 2\n"
    )
    folded = _serve(tmp_path, "9.9.3", NEW_LAYOUT, FAKE_ATTENTION, runner)
    (w,) = folded["warnings"]
    assert w.startswith("hook 'steps' (the model runner's step") and "(vLLM 9.9.3)" in w
    assert f"at {V1_RUNNER}.GPUModelRunner.execute_model but never fired while 12 attention forwards ran" in w


def test_hooks_that_do_not_match_the_version_are_named_not_an_empty_table(tmp_path):
    # A version where the Attention class was renamed and the runner's step method too.
    renamed = FAKE_ATTENTION.replace("class Attention:", "class AttentionLayer:")
    runner = "class GPUModelRunner:\n    def execute(self):\n        return 1\n"
    folded = _serve(tmp_path, "9.9.0", NEW_LAYOUT, renamed, runner)
    assert folded["layer_classes"] == []  # nothing was counted ...
    warnings = folded["warnings"]  # ... and the fold says exactly why, per hook and version
    label = f"Worker rank 0 pid {folded['processes'][0]['pid']} (vLLM 9.9.0)"
    assert any(
        w.startswith("hook 'attention' (the attention layer")
        and label in w
        and f"missing: {NEW_LAYOUT} has no class Attention" in w
        for w in warnings
    ), warnings
    assert any(
        w.startswith("hook 'steps'") and label in w and "has no GPUModelRunner.execute_model" in w for w in warnings
    ), warnings
    assert any(w.startswith("hook 'attention_forward'") and label in w for w in warnings), warnings
    assert folded["hooks"]["attention"]["found"] == {}
    assert any("! routing: hook 'attention'" in line for line in routing.routing_summary(folded))


def test_a_module_never_imported_is_named_with_the_places_tried(tmp_path):
    # The attention layer moved somewhere the recorder does not know: neither candidate is imported.
    folded = _serve(tmp_path, "9.9.1", "vllm.layers.attn", FAKE_ATTENTION, RUNNER_OK)
    (w,) = [w for w in folded["warnings"] if w.startswith("hook 'attention'")]
    assert "(vLLM 9.9.1): not imported: none of " in w and NEW_LAYOUT in w and OLD_LAYOUT in w
    assert folded["layer_classes"] == []


def test_a_live_server_process_without_a_record_is_named(tmp_path):
    records = tmp_path / "records"
    records.mkdir()
    # The API server's record arrived (patch applied); another process of the server wrote none.
    (records / "APIServer-1.json").write_text(
        json.dumps(
            {
                "schema": pc.RECORD_SCHEMA,
                "role": "APIServer",
                "pid": 1,
                "vllm_version": "0.30.0",
                "final": True,
                "patches_applied": ["widened-gfx11-gate"],
                "written_unix": time.time(),
            }
        )
    )
    env = {**os.environ, pc.ENV_RECORD_DIR: str(records)}
    # A process of "the server" (same E2E_RECORD_DIR) in which the plugin never loaded.
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)  # spawn_main stand-in"], env=env)
    # vLLM retitles its engine core and workers: the command line is then VLLM::EngineCore.
    q = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)  # VLLM::EngineCore"], env=env)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)  # resource_tracker"], env=env)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not {p.pid, q.pid} <= set(routing.serving_processes(records) or {}):
            time.sleep(0.1)
        arm = ArmCfg(name="widened", patches=("widened-gfx11-gate",))
        folded = routing.fold_records(records, arm, wait_s=0)
        assert [u["pid"] for u in folded["unrecorded_processes"]] == sorted([p.pid, q.pid])  # not the tracker
        assert any(
            w.startswith(f"vLLM 0.30.0: live server process pid {p.pid} wrote no routing record")
            for w in folded["warnings"]
        ), folded["warnings"]
        assert f"pid {p.pid} (no record)" in routing.patch_problem(folded, arm)
    finally:
        for proc in (p, q, bystander):
            proc.kill()
            proc.wait()
    assert routing.fold_records(records, ArmCfg(name="stock"), wait_s=0)["unrecorded_processes"] == []


@pytest.mark.parametrize("patch", ["tests.patches.nope:install", "tests.patches.marker:no_such_function"])
def test_a_patch_target_missing_on_the_version_fails_register_with_the_version(tmp_path, patch):
    fake = _fake_vllm(tmp_path / "fake", "9.9.2", NEW_LAYOUT, FAKE_ATTENTION, RUNNER_OK)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(fake), str(ROOT)]),
        pc.ENV_ON: "1",
        pc.ENV_ARM: "x",
        pc.ENV_PATCHES: patch,
        pc.ENV_RECORD_DIR: str(tmp_path / "r"),
    }
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(WORKER), NEW_LAYOUT, V1_RUNNER],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0
    line = next(ln for ln in r.stderr.splitlines() if ln.startswith("e2e plugin:"))
    assert f"patch {patch!r}" in line and "vLLM 9.9.2" in line and "[Worker pid" in line
    folded = routing.fold_records(tmp_path / "r", ArmCfg(name="x"), wait_s=0)
    assert routing.patch_problem(folded, ArmCfg(name="x")).startswith("plugin failed in Worker")
    assert folded["warnings"] == []  # the failed patch is the story, not the hooks never reached
