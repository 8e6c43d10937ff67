"""Test patch: make the worker's behaviour visibly different, so a test can see a patch took effect.

`tests.patches.marker:install` wraps vLLM's LogitsProcessor.forward (run by the worker only) so that
every logit except token E2E_MARKER_TOKEN is -inf: greedy decoding then returns that token at every
position, which the test reads from /v1/completions. Without E2E_MARKER_TOKEN the wrapper changes
nothing (the patch still installs: an arm that only proves the plugin path).
"""

from __future__ import annotations

import functools
import os

TARGET = "vllm.model_executor.layers.logits_processor.LogitsProcessor.forward"


def install() -> str:
    token = os.environ.get("E2E_MARKER_TOKEN")
    from vllm.model_executor.layers.logits_processor import LogitsProcessor

    original = LogitsProcessor.forward
    if getattr(original, "_e2e_marker", False):
        return "already installed"

    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        logits = original(self, *args, **kwargs)
        if token is not None and logits is not None:
            t = int(token)
            keep = logits[..., t].clone()
            logits.fill_(float("-inf"))
            logits[..., t] = keep
        return logits

    forward._e2e_marker = True  # type: ignore[attr-defined]
    LogitsProcessor.forward = forward
    return f"wrapped {TARGET} (token {token})"
