"""The run folder is a closed world: the harness writes only to regular files and folders inside it,
never through a link to somewhere else.

    check_closed(root)       a symlink (or fifo, socket, device) anywhere under root is refused with one
                             line naming it: called before a run folder is locked or reported on, so
                             nothing is written at all
    open_append(path)        appends (rows, server logs) opened with O_NOFOLLOW and refused when the
                             file has another hard link: a link planted after the check still cannot
                             redirect a write
    atomic_writer(path)      outputs written to a new name beside path, fsynced and renamed over it: a
                             rename replaces a link (or a hard link) and never writes through it, and
                             a writer that fails leaves the old file
    real_dir(root, *parts)   root/part/..., made where missing, each part a real folder

root itself may be reached through a link (results/latest -> a run, or a results root on another
disk): that is the user's own path. Only what is inside it must be the run's own.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from e2e.errors import UserError

_EXCL = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW


def link_refused(path: Path | str) -> UserError:
    return UserError(
        f"{path}: is a symlink; a run folder holds no links and nothing is written through "
        "one: replace it with the file or folder itself"
    )


def check_closed(root: Path | str) -> None:
    """Every entry under root is a regular file or a real folder (links are not followed)."""
    root = Path(root)
    if not root.is_dir():
        return  # missing or not a folder: the caller's own reader says so
    stack = [root]
    try:
        while stack:
            folder = stack.pop()
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
            for e in entries:
                if e.is_symlink():
                    raise link_refused(e.path)
                if e.is_dir(follow_symlinks=False):
                    stack.append(Path(e.path))
                elif not e.is_file(follow_symlinks=False):
                    raise UserError(
                        f"{e.path}: is not a regular file or folder (a fifo, socket or device); "
                        "a run folder holds only its own files"
                    )
    except OSError as exc:
        raise UserError(f"{exc.filename or root}: cannot read: {exc.strerror}") from None


def open_nofollow(path: Path | str, flags: int, mode: int = 0o666) -> int:
    """os.open that refuses a symlink as the last component (one line), and a file that has another
    hard link when it is opened for writing (the write would change that file too)."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(path):
            raise link_refused(path) from None
        raise
    if flags & (os.O_WRONLY | os.O_RDWR):
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            os.close(fd)
            raise UserError(
                f"{path}: has another hard link, which would receive these writes too: "
                "give the run folder its own copy (cp, not cp -l)"
            )
    return fd


def open_append(path: Path | str) -> IO[bytes]:
    """An unbuffered append-only file (made if missing) that is not reached through a link."""
    return os.fdopen(open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab", buffering=0)


@contextlib.contextmanager
def atomic_writer(path: Path | str, text: bool = False) -> Iterator[IO[Any]]:
    """Write a new file to a random name beside path; on success fsync it and rename it over path.
    The temporary is created O_EXCL|O_NOFOLLOW (a planted name cannot be written through); its mode
    follows the umask like any new file. text: UTF-8 with newlines as written (csv's own)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
    fd = os.open(tmp, _EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") if text else os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_atomic(path: Path | str, data: bytes | str) -> None:
    with atomic_writer(path, text=isinstance(data, str)) as f:
        f.write(data)


def real_dir(root: Path | str, *parts: str) -> Path:
    """root/parts..., each part made where missing and refused when it is a link or not a folder."""
    d = Path(root)
    for part in parts:
        d = d / part
        with contextlib.suppress(FileExistsError):
            os.mkdir(d)
        if os.path.islink(d):
            raise link_refused(d)
        if not d.is_dir():
            raise UserError(f"{d}: is not a folder")
    return d


def output_folder(folder: Path | str, what: str) -> Path:
    """A command's --out folder, made where missing, that can take new files; else one line naming it."""
    d = Path(folder)
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe_writable(d)
    except OSError as exc:
        raise UserError(f"{what} {d}: cannot write there ({exc.strerror or type(exc).__name__})") from None
    return d


def probe_writable(folder: Path | str) -> None:
    """Raise the OSError of a folder that cannot take a new file (the probe is never a planted name)."""
    probe = Path(folder) / f".write-probe-{os.getpid()}-{secrets.token_hex(3)}"
    os.close(os.open(probe, _EXCL, 0o600))
    os.unlink(probe)
