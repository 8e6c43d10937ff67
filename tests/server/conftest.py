"""The fixtures of real-server tests: the served model. Only tests under tests/server/ see them (a
test elsewhere that asks for `smollm2` is a server test in the wrong folder)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import SMOLLM2


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The real SmolLM2-135M folder, built by `python run_e2e.py assets smollm2` (.ci/run does)."""
    if not (SMOLLM2 / "config.json").is_file():
        pytest.fail(f"{SMOLLM2} missing: run `python run_e2e.py assets smollm2` first")
    return SMOLLM2
