"""HBM floor arithmetic, checked by hand against the sizing in gpu-machine.md."""

from __future__ import annotations

import pytest

from e2e.gpu import roofline

# gemma-3-27b-it (text part) with a compressed-tensors W4A16 pack-quantized group-128 config,
# as RedHatAI-style w4a16 checkpoints ship it.
GEMMA3_27B_W4A16 = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "text_config": {
        "model_type": "gemma3_text",
        "num_hidden_layers": 62,
        "hidden_size": 5376,
        "intermediate_size": 21504,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "head_dim": 128,
        "vocab_size": 262208,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
    },
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": True,
    "quantization_config": {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 4, "group_size": 128, "strategy": "group", "symmetric": True, "type": "int"},
            }
        },
        "ignore": ["lm_head"],
    },
}


def test_gemma3_27b_w4a16_tp2_matches_the_hand_sizing():
    g = roofline.geometry(GEMMA3_27B_W4A16)
    assert sum(g.sliding) == 52 and g.layers - sum(g.sliding) == 10  # every 6th layer global
    assert g.weight_bits == pytest.approx(4 + 16 / 128)
    b = roofline.step_bytes(g, 32768, tp=2)
    per_layer = 5376 * 4096 * 2 + 2 * 5376 * 2048 + 3 * 5376 * 21504
    assert b["weights"] == pytest.approx(62 * per_layer * 4.125 / 8 / 2)
    assert b["lm_head"] == pytest.approx(262208 * 5376 * 2 / 2)
    # gpu-machine.md: 10 global layers at 32K read 2.7 GB of KV, 1.35 GB per GPU at TP 2,
    # plus the 52 sliding layers' 1024-token windows
    glob = 10 * 32768 * 8 * 128 * 2 * 2
    assert glob == pytest.approx(1.34e9, rel=0.01)
    assert b["kv"] == pytest.approx(glob + 52 * 1024 * 8 * 128 * 2 * 2)
    # "about 8.5 GB read per decode step per GPU ... a floor near 1.8 ms per token" (weights only)
    assert (b["weights"] + b["lm_head"]) / 1e9 == pytest.approx(8.3, abs=0.3)
    assert roofline.floor_ms(g, 1024, 2, 4800) == pytest.approx(1.75, abs=0.1)
    assert roofline.floor_ms(g, 32768, 2, 4800) > roofline.floor_ms(g, 1024, 2, 4800) + 0.25


def test_sliding_window_caps_kv_and_layer_types_win():
    cfg = {
        "num_hidden_layers": 4,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 100,
        "sliding_window": 10,
        "model_type": "gemma3_text",
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    }
    g = roofline.geometry(cfg)
    assert g.sliding == (True, False, True, False)
    kv = roofline.step_bytes(g, 1000)["kv"]
    assert kv == (2 * 10 + 2 * 1000) * 2 * 2 * 16 * 2
    # KV heads never split below one per GPU
    assert roofline.step_bytes(g, 1000, tp=4)["kv"] == kv / 2


def test_llama_has_no_sliding_and_unquantized_weights_at_dtype():
    # SmolLM2-135M-Instruct's config.json (assets/), the CPU lane's model
    cfg = {
        "num_hidden_layers": 30,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "vocab_size": 49152,
        "model_type": "llama",
        "dtype": "bfloat16",
        "tie_word_embeddings": True,
    }
    g = roofline.geometry(cfg)
    assert not any(g.sliding) and g.weight_bits == 16 and g.quant == "none"
    b = roofline.step_bytes(g, 256)
    assert b["kv"] == 30 * 256 * 2 * 3 * 64 * 2
    assert b["weights"] + b["lm_head"] == pytest.approx(134.5e6 * 2, rel=0.02)  # 135M parameters


@pytest.mark.parametrize(
    "name,bw",
    [
        ("NVIDIA H200", 4800),
        ("NVIDIA H100 80GB HBM3", 3350),
        ("NVIDIA H100 PCIe", 2000),
        ("NVIDIA A100-SXM4-80GB", 2039),
        ("AMD Instinct MI300X", 5300),
        ("AMD Radeon RX 7900 XT", 800),
        ("AMD Radeon RX 7900 XTX", 960),
    ],
)
def test_known_gpus(name, bw):
    assert roofline.bandwidth_for(name)[0] == bw


def test_bandwidth_override_and_unknowns():
    assert roofline.bandwidth_for(None, 1000.0) == (1000.0, "stats.gpu_bandwidth_gbps")
    assert roofline.bandwidth_for("NVIDIA H200", 1000.0)[0] == 1000.0
    with pytest.raises(roofline.Unavailable, match="unknown GPU"):
        roofline.bandwidth_for("Some Future GPU")
    with pytest.raises(roofline.Unavailable, match="no GPU"):
        roofline.bandwidth_for(None)


def test_absent_model_folder_is_unavailable_not_guessed(tmp_path):
    with pytest.raises(roofline.Unavailable, match="not found"):
        roofline.read_model_config("google/gemma-3-27b-it", (tmp_path,))
    with pytest.raises(roofline.Unavailable, match="lacks"):
        roofline.geometry({"hidden_size": 4})
    q = {**GEMMA3_27B_W4A16, "quantization_config": {"quant_method": "bitsandbytes"}}
    with pytest.raises(roofline.Unavailable, match="not modelled"):
        roofline.geometry(q)


def test_floors_dict():
    f = roofline.floors(GEMMA3_27B_W4A16, [1024, 32768], 2, "NVIDIA H200")
    assert f["available"] and f["bandwidth_gbps"] == 4800 and f["global_layers"] == 10
    assert f["per_depth"]["32768"]["floor_ms"] > f["per_depth"]["1024"]["floor_ms"]


def test_floors_without_a_measurement_are_as_before():
    f = roofline.floors(GEMMA3_27B_W4A16, [1024], 2, "NVIDIA H200")
    g = roofline.geometry(GEMMA3_27B_W4A16)
    e = f["per_depth"]["1024"]
    assert e["floor_ms"] == roofline.floor_ms(g, 1024, 2, 4800) and e["floor_measured_ms"] is None
    assert f["measured_bandwidth_gbps"] is None and f["measured_bandwidth_source"] is None
    assert f["measured_fraction_of_datasheet"] is None and f["bandwidth_source"] == "table (H200)"


def test_floors_against_the_measured_bandwidth_too():
    f = roofline.floors(GEMMA3_27B_W4A16, [1024, 32768], 2, "NVIDIA H200", measured_gbps=4000.0)
    g = roofline.geometry(GEMMA3_27B_W4A16)
    for d in (1024, 32768):
        e = f["per_depth"][str(d)]
        assert e["floor_ms"] == pytest.approx(roofline.floor_ms(g, d, 2, 4800))
        assert e["floor_measured_ms"] == pytest.approx(roofline.floor_ms(g, d, 2, 4000))
        assert e["floor_measured_ms"] == pytest.approx(e["floor_ms"] * 4800 / 4000)
    assert f["bandwidth_gbps"] == 4800 and f["measured_bandwidth_gbps"] == 4000
    assert f["measured_fraction_of_datasheet"] == pytest.approx(4000 / 4800)
    assert "measured" in f["measured_bandwidth_source"]
    # the override stays the datasheet side; the measurement is its own column
    o = roofline.floors(GEMMA3_27B_W4A16, [1024], 2, "NVIDIA H200", 1000.0, 4000.0)
    assert o["bandwidth_source"] == "stats.gpu_bandwidth_gbps"
    assert o["per_depth"]["1024"]["floor_ms"] == pytest.approx(4 * o["per_depth"]["1024"]["floor_measured_ms"])


def test_a_gpu_missing_from_the_table_gets_measured_floors_only():
    f = roofline.floors(GEMMA3_27B_W4A16, [1024], 2, "Some Future GPU", measured_gbps=9000.0)
    e = f["per_depth"]["1024"]
    assert e["floor_ms"] is None and e["floor_measured_ms"] > 0
    assert f["bandwidth_gbps"] is None and f["bandwidth_source"].startswith("unavailable: unknown GPU")
    with pytest.raises(roofline.Unavailable, match="unknown GPU"):
        roofline.floors(GEMMA3_27B_W4A16, [1024], 2, "Some Future GPU")


@pytest.mark.parametrize("bad", [0, -5.0, float("nan"), float("inf"), "4000"])
def test_an_unusable_measurement_counts_as_none(bad):
    f = roofline.floors(GEMMA3_27B_W4A16, [1024], 2, "NVIDIA H200", measured_gbps=bad)
    assert f["measured_bandwidth_gbps"] is None and f["per_depth"]["1024"]["floor_measured_ms"] is None
    with pytest.raises(roofline.Unavailable):
        roofline.floors(GEMMA3_27B_W4A16, [1024], 2, "Some Future GPU", measured_gbps=bad)
