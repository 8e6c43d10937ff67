"""Optional dependencies: which extra of pyproject.toml brings which import, and the one line that
names the extra to install, said before any work starts (before a download, a run folder or a
server). tests/guarantees/test_docs_map.py checks this table against pyproject.toml."""

from __future__ import annotations

import importlib.util

from e2e.errors import UserError

EXTRAS = {
    "assets": ("gguf", "transformers", "safetensors"),  # GGUF -> HF folders (e2e/assets.py)
    "gsm8k": ("lm_eval",),  # the sign-off (e2e/accuracy/)
    "ray": ("ray",),  # --executor ray (e2e/run/executors/)
    "kernels": ("torch",),  # kernels_check/
    "amd": ("amdsmi",),  # AMD GPU state under ROCm (e2e/gpu/gpu_amd.py; never required: amd-smi, else said)
}


def missing(extra: str) -> list[str]:
    return [m for m in EXTRAS[extra] if importlib.util.find_spec(m) is None]


def require(extra: str, what: str) -> None:
    """UserError naming the extra when one of its imports is not installed."""
    gone = missing(extra)
    if gone:
        raise UserError(
            f"{what} needs {', '.join(gone)}, which is not installed: "
            f"pip install -e '.[{extra}]' (the '{extra}' extra of pyproject.toml)"
        )
