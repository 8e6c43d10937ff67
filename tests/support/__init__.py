"""Shared test support, in one place: the project root and assets, the config copier, the fields
every row has (this file); constructed rows and run folders (synthetic.py); processes a run
started (procs.py); the stand-in servers of the hardening and executor tests (hardening.py,
executor_standin.py). Fixtures are in tests/conftest.py, the served model's in tests/server/conftest.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
SMOLLM2 = ROOT / "assets" / "SmolLM2-135M-Instruct"

# What every row of a real run carries (tests/server/test_e2e_cpu.py, tests/server/test_executor_ray.py).
REQUEST_FIELDS = {
    "cell_id",
    "attempt",
    "pass",
    "arm",
    "depth",
    "n_tokens",
    "round",
    "t_client_s",
    "prompt_tokens",
    "completion_tokens",
    "finish_reason",
    "valid",
    "server_decode_s",
    "server_prefill_s",
    "server_e2e_s",
}
CELL_FIELDS = {
    "cell_id",
    "attempt",
    "pass",
    "arm",
    "depth",
    "status",
    "startup_s",
    "warmup_s",
    "measure_s",
    "decode_ms_per_token",
    "server_decode_ms_per_token",
    "log_path",
    "routing",
}


def executable(path: Path, text: str) -> Path:
    """A script the tests run as a stand-in (a server's python, a tool on PATH): written, made executable."""
    path.write_text(text)
    path.chmod(0o755)
    return path


def have_vllm() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:
        return False
    return True


def write_config(path: Path, base: str = "configs/cpu-demo.toml", **sections) -> Path:
    """A copy of a config with some tables replaced/extended (tests keep servers tiny). It serves the real
    SmolLM2: for tests/server/ only (tests/guarantees/test_tiers.py)."""
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


def results_index() -> ModuleType:
    """scripts/results_index.py (a script, not a package module), loaded as a module."""
    spec = importlib.util.spec_from_file_location("results_index", ROOT / "scripts" / "results_index.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
