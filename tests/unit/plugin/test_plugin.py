"""The plugin and the harness side of arms, without a server.

The widened gate is checked against the real gate source of every vLLM version in play (0.32 in this
venv; the GPU releases 0.23.0 and 0.26.0 from their excerpts in tests/data/vllm_excerpts); records
are folded from constructed files; the entry-point shim is proven in this venv and in a second
interpreter that does not have the project installed.
"""

from __future__ import annotations

import ast
import itertools
import json
import os
import subprocess
import sys
import sysconfig
import textwrap
import time
import types
from pathlib import Path

import pytest
import torch

from e2e.design.config import ArmCfg, parse_config
from e2e.errors import UserError
from e2e.plugin import hooks, instrument, patches, recorder
from e2e.rundir import routing as folding
from e2e.serve import launch
from tests.support import ROOT, kernel_standins, vllm_excerpts

VENV_GATE = Path(sysconfig.get_paths()["purelib"]) / "vllm" / "platforms" / "rocm.py"


# -- the widened gate --------------------------------------------------------------------------
def _compile_unmodified(source: str, filename: str):
    tree = ast.parse(source, filename=filename)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == patches.GATE_FUNC)
    fn.decorator_list, fn.returns = [], None
    for a in fn.args.args:
        a.annotation = None
    return compile(ast.fix_missing_locations(ast.Module(body=[fn], type_ignores=[])), filename, "exec")


def _namespace(gfx1x: bool) -> dict:
    # The module globals the gate reads: gfx11 (RDNA3) when gfx1x, else an NVIDIA build (no arch).
    return {"torch": torch, "_ON_GFX1X": gfx1x, "_ON_GFX9": False, "on_cdna": lambda: False}


# (release, source of the gate): the venv's file, and the carried GPU releases' (not installable here).
GATE_SOURCES = [
    (v, vllm_excerpts.Release(v, vllm_excerpts.load(v)).get("vllm/platforms/rocm.py", patches.GATE_FUNC))
    for v in vllm_excerpts.carried()
] + ([("venv", VENV_GATE.read_text())] if VENV_GATE.is_file() else [])


@pytest.mark.parametrize("release,src", GATE_SOURCES, ids=[v for v, _ in GATE_SOURCES])
def test_widened_gate_changes_only_the_gqa_lower_bound(release, src):
    path = f"vllm-{release}/vllm/platforms/rocm.py"
    assert src, f"no gate source for vLLM {release}"
    code, detail = patches.compile_widened(src, path, "test")
    assert "gqa_ratio >= 3" in detail["original_text"]
    for gfx1x in (True, False):
        ns = _namespace(gfx1x)
        widened = patches.build_widened(code, ns)
        original = patches.build_widened(_compile_unmodified(src, path), _namespace(gfx1x))
        assert widened.cache_info().currsize == 0  # cached like the original
        differ = []
        grid = itertools.product(
            (torch.bfloat16, torch.float16, torch.float32),
            (64, 128),
            (16, 32),
            (1, 2, 3, 4, 16, 17),
            (1024, 200_000),
            (0, 1024),
            ("auto", "fp8"),
        )
        for q, h, b, g, m, sw, kv in grid:
            w, o = widened(q, h, b, g, m, sw, kv, None, None), original(q, h, b, g, m, sw, kv, None, None)
            if w != o:
                differ.append((q, h, b, g, m, sw, kv))
                # Only ratios 1 and 2 move, and only where ratio 3 would pass every other condition.
                assert g in (1, 2) and w and original(q, h, b, 3, m, sw, kv, None, None)
        if gfx1x:
            # gemma-3-27b's global layers (ratio 2, head 128, block 16, no window) are admitted now.
            assert (torch.bfloat16, 128, 16, 2, 1024, 0, "auto") in differ
            assert not widened(torch.bfloat16, 128, 16, 2, 1024, 1024, "auto", None, None)  # sliding
        else:
            assert differ == []  # on NVIDIA the gate stays False whatever the bound


def test_widened_gate_refuses_a_changed_source():
    src = VENV_GATE.read_text().replace("gqa_ratio >= 3", "gqa_ratio >= 4")
    with pytest.raises(patches.PatchError, match=r"vLLM 9\.9\.9 has 0 comparisons 'gqa_ratio >= 3'"):
        patches.compile_widened(src, "rocm.py", "9.9.9")
    with pytest.raises(
        patches.PatchError,
        match=r"target vllm\.platforms\.rocm\.use_rocm_custom_paged_attention "
        r"does not exist in vLLM 9\.9\.9",
    ):
        patches.compile_widened("def other():\n    pass\n", "rocm.py", "9.9.9")


# -- applying patches in-process -----------------------------------------------------------------
@pytest.fixture
def fresh_gate(monkeypatch):
    """A fake vllm.platforms.rocm (the real one cannot import on CPU) and a clean gate state."""
    fake = kernel_standins.gate_module()
    monkeypatch.setitem(sys.modules, patches.GATE_MODULE, fake)
    saved = dict(vars(patches.GATE))
    patches._reset_for_tests()
    patches.GATE.installed = False
    patches.GATE.original = patches.GATE.observer = None
    yield fake
    vars(patches.GATE).update(saved)
    for n in patches.BUILTIN:
        patches.APPLIED.pop(n, None)


def test_every_builtin_patch_name_has_an_applier_and_the_config_accepts_it():
    """contract.py owns the names, patches.py the appliers: the two must name the same set."""
    from e2e.plugin import contract

    assert set(patches.BUILTIN) == set(contract.BUILTIN_PATCHES)
    for name in contract.BUILTIN_PATCHES:
        assert contract.patch_form_problem(name) is None
    assert contract.patch_form_problem("nope").startswith("unknown patch 'nope'")


def test_gate_always_off_in_process_and_observed(fresh_gate):
    seen = []
    patches.GATE.observer = lambda a, k, ans, orig: seen.append((a[3], ans, orig))
    assert patches.apply_patches(["gate-always-off"]) == ["gate-always-off"]
    gate = fresh_gate.use_rocm_custom_paged_attention
    assert gate is not None and gate(torch.bfloat16, 128, 16, 4, 1024, 0, "auto") is False
    assert gate.original(torch.bfloat16, 128, 16, 4, 1024, 0, "auto") is True  # vLLM's, untouched
    assert seen == [(4, False, True)]  # the patched answer, and vLLM's own beside it
    assert patches.APPLIED["gate-always-off"]["state"] == "installed"
    # The forced answers replace each other (kernels_check flips them per cell) ...
    assert patches.apply_patches(["gate-always-on"]) == ["gate-always-on"]
    assert fresh_gate.use_rocm_custom_paged_attention(torch.bfloat16, 128, 16, 1, 1024, 0, "auto") is True
    assert patches.apply_patches(["gate-always-off"]) == ["gate-always-off"]
    assert fresh_gate.use_rocm_custom_paged_attention(torch.bfloat16, 128, 16, 4, 1024, 0, "auto") is False
    # ... but a forced answer and the widened gate are a contradiction (the fake module here has no
    # source, which the widened patch needs first: either way it must refuse loudly).
    with pytest.raises(patches.PatchError, match="both replace|does not exist"):
        patches.apply_patches(["widened-gfx11-gate"])


def test_user_patch_errors_name_the_target_and_version(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "e2e_test_userpatch.py").write_text("def boom():\n    raise RuntimeError('target x.y.z is gone')\n")
    version = patches.vllm_version()
    with pytest.raises(patches.PatchError, match=rf"module 'e2e_no_such_mod' is not importable.*vLLM {version}"):
        patches.apply_patches(["e2e_no_such_mod:install"])
    with pytest.raises(patches.PatchError, match=rf"target e2e_test_userpatch\.nope does not exist.*vLLM {version}"):
        patches.apply_patches(["e2e_test_userpatch:nope"])
    with pytest.raises(patches.PatchError, match=rf"failed in vLLM {version}: RuntimeError: target x\.y\.z is gone"):
        patches.apply_patches(["e2e_test_userpatch:boom"])


def test_post_import_hook_runs_on_first_import_and_at_once_after(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "e2e_hook_target.py").write_text("VALUE = 1\n")
    got = []
    assert hooks.when_imported("e2e_hook_target", lambda m: got.append(m.VALUE)) is False
    assert got == [] and "e2e_hook_target" in hooks.pending()
    import e2e_hook_target  # noqa: F401

    assert got == [1] and "e2e_hook_target" not in hooks.pending()
    assert hooks.when_imported("e2e_hook_target", lambda m: got.append(2)) is True
    assert got == [1, 2]
    monkeypatch.delitem(sys.modules, "e2e_hook_target")


# -- the recorder --------------------------------------------------------------------------------
class _FakeImpl:
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output=None):
        return "ran"


class _FakeKernel:
    def __init__(self):
        self.launched = []

    def __getitem__(self, grid):
        return lambda **kw: self.launched.append(grid)


def _layer(name, sw=None):
    backend = types.SimpleNamespace(get_name=lambda: "FAKE_ATTN")
    return types.SimpleNamespace(
        layer_name=name,
        head_size=128,
        num_heads=32,
        num_kv_heads=16,
        sliding_window=sw,
        dtype=torch.bfloat16,
        kv_cache_dtype="auto",
        attn_backend=backend,
    )


def test_recorder_counts_per_layer_class_and_writes_atomically(tmp_path, monkeypatch):
    rec = recorder.Recorder(tmp_path / "records", "widened", mode="per-step")
    rec._cache_config = types.SimpleNamespace(block_size=16)
    monkeypatch.setattr(_FakeImpl, "forward", _FakeImpl.__dict__["forward"])
    instrument.hook_impl_class(rec, _FakeImpl)
    kern = _FakeKernel()
    mod = types.SimpleNamespace(__name__="fake_dispatch", kernel_paged_attention_2d=kern)
    instrument.hook_triton_2d(rec, mod)
    impl, cache = _FakeImpl(), torch.zeros(2, 4, 16, 16, 128)
    glob, slide = _layer("model.layers.5.attn"), _layer("model.layers.0.attn", sw=1024)
    q = torch.zeros(1, 32, 128, dtype=torch.bfloat16)
    for _ in range(3):  # three steps: both layers forward; the global one launches the 2D kernel
        assert impl.forward(slide, None, None, None, cache, "md") == "ran"
        assert impl.forward(slide, None, None, None, cache, None) == "ran"  # a profiling run: not counted
        rec.current = rec.layer_keys[id(glob)] if id(glob) in rec.layer_keys else rec.layer_class(glob, impl, cache)
        mod.kernel_paged_attention_2d[(1, 16)](
            query_ptr=q,
            key_cache_ptr=q,
            num_query_heads=32,
            num_queries_per_kv=2,
            HEAD_SIZE=128,
            PHYSICAL_BLOCK_SIZE=16,
            SLIDING_WINDOW=0,
        )
        rec.gate_call((torch.bfloat16, 128, 16, 2, 100, 0, "auto", None, None), {}, False)
        rec.current = recorder.NO_LAYER
        impl.forward(glob, None, None, None, cache, attn_metadata="md")
        rec.end_step()
    assert kern.launched == [(1, 16)] * 3
    path = rec.write()
    assert path.name == f"{rec.role}-{os.getpid()}.json" and not list(path.parent.glob(".*.tmp"))
    r = json.loads(path.read_text())
    keys = sorted(r["layers"])
    assert len(keys) == 2 and all(k.startswith("_FakeImpl h128 q32/kv16") for k in keys)
    slide_key = next(k for k in keys if "sw1024" in k)
    glob_key = next(k for k in keys if "sw-" in k)
    assert r["layers"][glob_key]["geometry"]["block_size"] == 16
    counts = {(c["layer_class"], c["path"]): c["n"] for c in r["counts"]}
    assert counts == {
        (slide_key, "forward:_FakeImpl"): 3,
        (glob_key, "forward:_FakeImpl"): 3,
        (glob_key, "triton_paged_attention_2d"): 3,
    }
    tri = next(c for c in r["counts"] if c["path"] == "triton_paged_attention_2d")
    assert tri["kernel_args"] == "h128 q32/kv16 bs16 sw- bfloat16 kv:bfloat16"
    (g,) = r["gate_calls"]
    assert g["answer"] is False and g["gqa_ratio"] == 2 and g["n"] == 3 and g["layer_class"] == glob_key
    assert r["model_steps"] == 3 and len(r["steps"]) == 3
    assert r["steps"][0][1] == {
        f"{slide_key}|forward:_FakeImpl": 1,
        f"{glob_key}|forward:_FakeImpl": 1,
        f"{glob_key}|triton_paged_attention_2d": 1,
        f"{glob_key}|gate:False": 1,
    }


@pytest.mark.parametrize(
    "mode,eager,note",
    [
        ("FULL_AND_PIECEWISE", False, recorder.GRAPH_NOTE_FULL),
        ("PIECEWISE", False, recorder.GRAPH_NOTE_EAGER),
        ("FULL_AND_PIECEWISE", True, recorder.GRAPH_NOTE_EAGER),
    ],
)
def test_record_says_where_counts_come_from(mode, eager, note):
    rec = recorder.Recorder(None, "a")
    rec.info.update(cudagraph_mode=mode, enforce_eager=eager)
    assert rec.snapshot()["counts_note"] == note


# -- folding records and refusing cells ------------------------------------------------------------
def _record(
    role,
    pid,
    patches_applied=(),
    rank=None,
    runs_model=False,
    tp_size=None,
    counts=(),
    layers=None,
    gate_calls=(),
    error=None,
    mode="NONE",
):
    return {
        "schema": recorder.SCHEMA,
        "arm": "widened",
        "role": role,
        "rank": rank,
        "pid": pid,
        "process_name": role,
        "runs_model": runs_model,
        "tp_size": tp_size,
        "error": error,
        "patches_requested": ["widened-gfx11-gate"],
        "patches_applied": list(patches_applied),
        "cudagraph_mode": mode if runs_model else None,
        "enforce_eager": False,
        "counts_note": recorder.GRAPH_NOTE_FULL if runs_model else None,
        "routing_mode": "aggregate",
        "layers": layers or {},
        "counts": list(counts),
        "gate_calls": list(gate_calls),
        "final": True,
        "written_unix": time.time(),
        "flush_s": 1.0,
    }


SW, GL = (
    "RocmAttentionImpl h128 q16/kv8 sw1024 bs16 bfloat16 kv:auto",
    "RocmAttentionImpl h128 q16/kv8 sw- bs16 bfloat16 kv:auto",
)


def _worker(rank, path):
    layers = {
        SW: {"geometry": {"sliding_window": 1024}, "layers": [f"l{i}" for i in range(10)]},
        GL: {"geometry": {"sliding_window": None}, "layers": ["l5", "l11"]},
    }
    counts = [
        {"layer_class": SW, "path": "forward:RocmAttentionImpl", "kernel_args": "", "n": 100},
        {"layer_class": SW, "path": "triton_paged_attention_2d", "kernel_args": "h128 q16/kv8", "n": 90},
        {"layer_class": GL, "path": "forward:RocmAttentionImpl", "kernel_args": "", "n": 20},
        {"layer_class": GL, "path": path, "kernel_args": "h128 q16/kv8", "n": 18},
    ]
    gate = [
        {
            "layer_class": GL,
            "qtype": "bfloat16",
            "head_size": 128,
            "block_size": 16,
            "gqa_ratio": 2,
            "sliding_window": 0,
            "kv_cache_dtype": "auto",
            "answer": path == "rocm_custom_op",
            "n": 18,
        }
    ]
    return _record("Worker", 100 + rank, ["widened-gfx11-gate"], rank, True, 2, counts, layers, gate)


def _write(d: Path, recs):
    d.mkdir(parents=True, exist_ok=True)
    for r in recs:
        (d / f"{r['role']}-{r['pid']}.json").write_text(json.dumps(r))
    return d


ARM = ArmCfg(name="widened", patches=("widened-gfx11-gate",))


def test_fold_gives_each_layer_class_its_path_and_processes(tmp_path):
    d = _write(
        tmp_path,
        [
            _record("APIServer", 1, ["widened-gfx11-gate"]),
            _record("EngineCore", 2, ["widened-gfx11-gate"]),
            _worker(0, "rocm_custom_op"),
            _worker(1, "rocm_custom_op"),
        ],
    )
    routing_ = folding.fold_records(d, ARM, wait_s=0)
    assert routing_["n_processes"] == 4 and routing_["arm"] == "widened"
    by = {c["layer_class"]: c for c in routing_["layer_classes"]}
    assert by[SW]["path"] == "triton_paged_attention_2d" and by[GL]["path"] == "rocm_custom_op"
    assert by[GL]["paths"] == {"forward:RocmAttentionImpl": 40, "rocm_custom_op": 36}
    assert by[SW]["n_layers"] == 10 and by[GL]["n_layers"] == 2
    assert by[GL]["processes"] == ["Worker rank 0 pid 100", "Worker rank 1 pid 101"]
    (g,) = routing_["gate"]
    assert g["answer"] is True and g["n"] == 36 and len(g["processes"]) == 2
    assert routing_["counts_note"] == [recorder.GRAPH_NOTE_FULL]
    assert folding.patch_problem(routing_, ARM) is None
    lines = folding.routing_summary(routing_)
    assert lines[0].startswith("arm widened: 4 processes") and len(lines) == 1 + 2 + 1
    assert any(line.startswith(f"  {GL} x2: rocm_custom_op [") for line in lines)


def test_patch_problem_refuses_cells_that_did_not_run_the_arm(tmp_path):
    def problem(recs, arm=ARM):
        d = tmp_path / f"r{len(list(tmp_path.iterdir()))}"
        _write(d, recs)
        return folding.patch_problem(folding.fold_records(d, arm, wait_s=0), arm)

    w0, w1 = _worker(0, "triton_paged_attention_2d"), _worker(1, "triton_paged_attention_2d")
    assert problem([]) == "no plugin records arrived: patches ['widened-gfx11-gate'] not proven applied"
    assert problem([], ArmCfg(name="stock")) is None
    assert (
        problem([_record("APIServer", 1, []), w0, w1])
        == "patches ['widened-gfx11-gate'] not applied in APIServer pid 1"
    )
    assert (
        problem([_record("APIServer", 1, ["widened-gfx11-gate"])])
        == "patches ['widened-gfx11-gate']: no record from a process that runs the model (worker)"
    )
    assert (
        problem([_record("APIServer", 1, ["widened-gfx11-gate"]), w0])
        == "patches ['widened-gfx11-gate']: records from ranks [0] of tensor-parallel size 2"
    )
    broken = _record("EngineCore", 2, [], error="e2e plugin: patch 'x:y' ...")
    assert problem([broken], ArmCfg(name="stock")) == "plugin failed in EngineCore pid 2: e2e plugin: patch 'x:y' ..."


def test_fold_waits_for_a_flush_then_marks_a_silent_process_stale(tmp_path):
    live = _record("Worker", 7, runs_model=True)
    live.update(final=False, written_unix=time.time() - 60, flush_s=0.1)
    _write(tmp_path, [live])
    t0 = time.monotonic()
    r = folding.fold_records(tmp_path, ArmCfg(name="stock"))
    assert 0.2 <= time.monotonic() - t0 < 5  # waited 2.5 flush intervals for a fresher record
    assert r["processes"][0]["stale"] is True


# -- the environment and the entry-point shim -------------------------------------------------------
CFG = {
    "model": {"path": "m"},
    "workload": {"depths": [128]},
    "server": {"env": {"PYTHONPATH": "/server/path"}},
    "arms": [
        {"name": "a", "patches": ["widened-gfx11-gate"], "env": {"PYTHONPATH": "/arm/path"}},
        {"name": "b", "env": {"VLLM_PLUGINS": "other", "E2E_ROUTING_MODE": "per-step"}},
        {"name": "c", "env": {"E2E_ROUTING_MODE": "sometimes"}},
    ],
}


def test_plugin_env_keeps_pythonpath_and_allow_list(tmp_path):
    cfg = parse_config(CFG)
    a = launch.plugin_env(cfg.arms[0], tmp_path, cfg)
    shim = launch.shim_dir()
    assert a["PYTHONPATH"].split(os.pathsep) == [str(shim), str(ROOT), "/arm/path"]
    assert a["E2E_PATCHES"] == "widened-gfx11-gate" and a["E2E_PLUGIN"] == "1" and a["E2E_ARM"] == "a"
    eps = next(shim.glob("*.dist-info")) / "entry_points.txt"
    assert eps.read_text() == "[vllm.general_plugins]\ne2e_arms = e2e.plugin:register\n"
    b = launch.plugin_env(cfg.arms[1], tmp_path, cfg)
    assert b["PYTHONPATH"].split(os.pathsep)[2] == "/server/path"
    assert b["VLLM_PLUGINS"] == "other,e2e_arms" and b["E2E_ROUTING_MODE"] == "per-step"
    with pytest.raises(UserError, match="arm c: E2E_ROUTING_MODE='sometimes'"):
        launch.plugin_env(cfg.arms[2], tmp_path, cfg)


_PROBE = textwrap.dedent("""
    import json, os, sys
    from importlib.metadata import entry_points
    eps = [e for e in entry_points(group="vllm.general_plugins") if e.name == "e2e_arms"]
    out = {"n": len(eps), "dist": [str(getattr(e.dist, "_path", "")) for e in eps]}
    try:
        import e2e; out["e2e"] = e2e.__file__
    except ImportError as exc:
        out["e2e"] = None
    if os.environ.get("LOAD"):
        import vllm.plugins as vp
        vp.load_general_plugins()
        import e2e.plugin as p
        out["recorder"] = p.current_recorder() is not None
    print(json.dumps(out))
""")


def _probe(python: str, env_extra: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2E_") and k != "PYTHONPATH"}
    r = subprocess.run(
        [python, "-c", _PROBE], capture_output=True, text=True, env={**env, **env_extra}, timeout=300, cwd="/"
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_shim_loads_the_plugin_once_where_the_project_is_installed(tmp_path):
    cfg = parse_config(CFG)
    env = launch.plugin_env(ArmCfg(name="x"), tmp_path, cfg)
    plain = _probe(sys.executable, {})
    assert plain["n"] == 1 and "vllm_e2e_bench-0.1.0.dist-info" in plain["dist"][0]  # the editable install
    shimmed = _probe(sys.executable, {"PYTHONPATH": env["PYTHONPATH"]})
    assert shimmed["n"] == 1 and shimmed["dist"][0].startswith(str(launch.shim_dir()))  # deduplicated by name


def make_second_venv(where: Path) -> Path:
    """A second interpreter that reaches this venv's packages but NOT the project's dist-info or
    editable finder (a stand-in for another vLLM installation). Returns its python."""
    venv = where / "venv2"
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        site = Path(sysconfig.get_paths()["purelib"])
        mirror = where / "mirror-site"
        mirror.mkdir(exist_ok=True)
        for p in site.iterdir():
            if "vllm_e2e_bench" in p.name:  # the project's dist-info, .pth and finder stay out
                continue
            if not (mirror / p.name).exists():
                (mirror / p.name).symlink_to(p)
        sp = next((venv / "lib").glob("python3.*")) / "site-packages"
        (sp / "zz_main_venv.pth").write_text(f"import site; site.addsitedir({str(mirror)!r})\n")
    return venv / "bin" / "python"


@pytest.fixture(scope="session")
def second_python(tmp_path_factory):
    return make_second_venv(tmp_path_factory.mktemp("second-install"))


def test_second_interpreter_loads_the_plugin_through_the_shim(second_python, tmp_path):
    cfg = parse_config(CFG)
    bare = _probe(str(second_python), {})
    assert bare["n"] == 0 and bare["e2e"] is None  # the project is not installed there
    env = launch.plugin_env(ArmCfg(name="second", patches=("widened-gfx11-gate",)), tmp_path / "rec", cfg)
    env["PYTHONPATH"] = os.pathsep.join(p for p in env["PYTHONPATH"].split(os.pathsep) if "/path" not in p)
    got = _probe(str(second_python), {**env, "LOAD": "1"})
    assert got["n"] == 1 and got["dist"][0].startswith(str(launch.shim_dir()))
    assert got["e2e"] == str(ROOT / "e2e" / "__init__.py") and got["recorder"] is True
    (rec,) = [json.loads(p.read_text()) for p in (tmp_path / "rec").glob("*.json")]
    assert rec["executable"] == str(second_python) and rec["patches_applied"] == ["widened-gfx11-gate"]
    assert rec["plugin_dist"].startswith(str(launch.shim_dir()))


def test_slow_decode_patch_delays_only_calls_that_run_tokens(monkeypatch):
    """The validation's known slowdown: a 30 ms sleep per step that runs tokens, none for the empty
    schedules vLLM's batch queue also sends (they made a 30 ms delay cost ~40 ms per token)."""
    from types import SimpleNamespace

    cpu_model_runner = pytest.importorskip("vllm.v1.worker.cpu_model_runner")
    from tests.patches import slow_decode

    events = []  # the runner's calls and the patch's sleeps, in order (no clock: nothing to flake)
    monkeypatch.setattr(
        cpu_model_runner.CPUModelRunner,
        "execute_model",
        lambda self, sched, *a: events.append(("run", sched.total_num_scheduled_tokens)) or "out",
    )
    monkeypatch.setattr(slow_decode.time, "sleep", lambda s: events.append(("sleep", s)))
    monkeypatch.setenv("E2E_TEST_DELAY_MS", "50")
    slow_decode.install()
    run = cpu_model_runner.CPUModelRunner.execute_model
    for n in (0, 1, 0):
        assert run(None, SimpleNamespace(total_num_scheduled_tokens=n)) == "out"
    assert events == [("run", 0), ("sleep", 0.05), ("run", 1), ("run", 0)]


def test_slow_decode_patch_can_switch_its_delay_on_after_n_steps(monkeypatch, capsys):
    """The bookends' step (tests/server/test_bookends.py): no delay for the first N steps that run tokens."""
    from types import SimpleNamespace

    cpu_model_runner = pytest.importorskip("vllm.v1.worker.cpu_model_runner")
    from tests.patches import slow_decode

    events = []
    monkeypatch.setattr(
        cpu_model_runner.CPUModelRunner,
        "execute_model",
        lambda self, sched, *a: events.append(("run", sched.total_num_scheduled_tokens)),
    )
    monkeypatch.setattr(slow_decode.time, "sleep", lambda s: events.append(("sleep", s)))
    monkeypatch.setenv("E2E_TEST_DELAY_MS", "50")
    monkeypatch.setenv("E2E_TEST_DELAY_AFTER_STEPS", "2")
    slow_decode.install()
    for n in (1, 0, 1, 1, 0, 1):
        cpu_model_runner.CPUModelRunner.execute_model(None, SimpleNamespace(total_num_scheduled_tokens=n))
    assert events == [
        ("run", 1),
        ("run", 0),
        ("run", 1),
        ("sleep", 0.05),
        ("run", 1),
        ("run", 0),
        ("sleep", 0.05),
        ("run", 1),
    ]
    assert "slow_decode: delay on from step 3" in capsys.readouterr().out
