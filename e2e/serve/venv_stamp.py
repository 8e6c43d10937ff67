"""A finished venv build (e2e/serve/venvs.py): its stamp (e2e-env.json, written last), the freeze it
records and the constraints file made from it, and the check that a venv still is what its stamp says."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from e2e.design.config import first_error
from e2e.errors import UserError
from e2e.serve.venv_spec import read_regular

RECIPE = "e2e-env/1"  # the build steps (venv_build.py); change it when they change, so old venvs get a new key
STAMP = "e2e-env.json"
FREEZE = "e2e-env-freeze.txt"  # the stamp's freeze as a pip constraints file: --constraints rebuilds it
TEXT_MAX = 64 << 20  # a stamp, a constraints file, a config: text files, never this big

Runner = Callable[..., subprocess.CompletedProcess[str]]


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
        raise UserError(f"env: pip freeze failed in {vpy}: {last_error(r.stderr)}")
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


def last_error(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip() and "is ignored" not in ln]
    errs = [ln for ln in lines if ln.startswith("ERROR")]
    # A failed build: pip's own summary lines name no cause; the build's "error: ..." line does.
    errs = errs or [
        ln
        for ln in lines
        if ln.lower().startswith("error:") and "subprocess-exited" not in ln and "metadata-generation-failed" not in ln
    ]
    return (errs or lines or ["(no output)"])[0][:400]
