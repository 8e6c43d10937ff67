"""The run folder: manifest, plan, append-only JSONL rows, logs, resume and a lock.

    results/<run-id>/
        manifest.json    resolved config, server commands, versions, host, git commit, start/end
        plan.json        the cells in order
        requests.jsonl   one row per timed request (appended and flushed as measured; a voided
                         attempt's rows marked in place, void_rows)
        cells.jsonl      one row per finished cell (ok or failed)
        rows.jsonl       (a kernels_check run folder: one row per probe, path and fault; kernels_check/)
        logs/<cell>.log  each server's output
        cells/<cell>/    per-cell files written by other parts (routing records)
        .lock            held while a run writes here

The folder is a closed world (e2e/safety/safe_io.py): a symlink anywhere in it is refused before the lock
is taken, rows are appended without following links, and JSON is replaced by rename.

Rows are written once and analysed many times: every figure in a report is recomputed from them.
A cell attempt that did not finish (interrupt, crash) leaves request rows with an attempt id that no
cells.jsonl row names; analysis ignores them and `--resume` runs the cell again.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

from e2e.design.config import is_plain_name
from e2e.errors import UserError
from e2e.rundir import formats
from e2e.rundir.formats import CellRowDict, RequestRowDict
from e2e.rundir.gpu_rows import VOIDED
from e2e.safety.safe_io import check_closed, open_append, open_nofollow, probe_writable, real_dir, write_atomic

MANIFEST = "manifest.json"
PLAN = "plan.json"
REQUESTS = "requests.jsonl"
CELLS = "cells.jsonl"
KERNEL_ROWS = "rows.jsonl"  # a kernels_check run folder's rows (kernels_check/sweep.py writes them)
PROFILES = "profiles.jsonl"  # one row per profiled cell (e2e/profile/): absent where none was taken
Row = TypeVar("Row", bound=Mapping[str, Any])  # a request row: RequestRowDict, or a plain dict of one
KIND = {CELLS: "cells", REQUESTS: "requests", KERNEL_ROWS: "kernels", PROFILES: "profiles"}  # file -> formats kind
MODEL_CONFIG = "model/config.json"  # the served model's config.json, as it was at the start
ATTEMPT_DIR = re.compile(
    r"^(records|gpu|profile)-a(\d+)$"
)  # cells/<server>/ per attempt: routing records, GPU samples, traces


def run_folder(out: str | Path, run_id: str | None, config_name: str, suffix: str = "") -> Path:
    """<out>/<run-id>: the run id given, or a time stamp and the config's name. A run id is a plain
    name (letters, digits, '_', '.', '-'; no '..'), never a path: a run stays under its root."""
    import time

    name = run_id or f"{time.strftime('%Y%m%d-%H%M%S')}-{config_name}{suffix}"
    if not is_plain_name(name):
        if run_id:
            raise UserError(
                f"--run-id {run_id!r}: give a plain name (letters, digits, '_', '.', '-'; "
                "no '..'), not a path; --out sets where it goes"
            )
        raise UserError(
            f"name {config_name!r}: the config's name makes the run folder's name; use "
            "letters, digits, '_', '.', '-' (or give --run-id)"
        )
    return Path(out) / name


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """All complete rows. A torn LAST line (a crash mid-write) is skipped; a torn line elsewhere
    means the file was damaged some other way, and is an error."""
    if not path.exists():
        return []
    lines = path.read_bytes().split(b"\n")
    rows = []
    for i, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            rows.append(json.loads(raw))
        except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested beyond parsing
            if i >= len(lines) - 2 and not path.read_bytes().endswith(b"\n"):
                break  # torn last line
            raise UserError(f"{path}: line {i + 1} is not JSON (file damaged)") from None
    return rows


def _set_aside_torn_tail(path: Path) -> None:
    """A crash mid-write leaves a torn last line that the next row would glue onto. Move the torn
    bytes to <file>.torn (kept for inspection, never parsed) and cut the file back to its last
    complete row."""
    if not path.exists():
        return
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return
    cut = data.rfind(b"\n") + 1
    with open_append(path.with_name(path.name + ".torn")) as t:
        t.write(data[cut:] + b"\n")
    fd = open_nofollow(path, os.O_RDWR)
    try:
        os.ftruncate(fd, cut)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, obj: Any) -> None:
    write_atomic(path, json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        raise UserError(f"{path}: missing") from None
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise UserError(
            f"{path}: not JSON ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}) (file damaged)"
        ) from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror}") from None


class RunStore:
    """One results folder. Use as a context manager: it holds an exclusive lock while open."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._lock_fd: int | None = None
        self._files: dict[str, Any] = {}

    # -- life ---------------------------------------------------------------------------------
    @classmethod
    def create(cls, root: Path) -> RunStore:
        root = Path(root)
        if root.exists() and any(root.iterdir()):
            raise UserError(f"{root} exists and is not empty: use --resume {root} or another --out")
        try:
            (root / "logs").mkdir(parents=True, exist_ok=True)
            (root / "cells").mkdir(exist_ok=True)
        except OSError as exc:
            raise UserError(f"cannot create results folder {root}: {exc.strerror}") from None
        return cls(root)

    @classmethod
    def open_existing(cls, root: Path) -> RunStore:
        root = Path(root)
        if not (root / MANIFEST).is_file() or not (root / PLAN).is_file():
            raise UserError(f"{root}: not a run folder (no manifest.json/plan.json)")
        return cls(root)

    def __enter__(self) -> RunStore:
        self.lock()
        self.check_writable()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def lock(self) -> None:
        check_closed(self.root)  # before anything is written, the lock file included
        for server_dir in sorted((self.root / "cells").glob("*")):
            voided(server_dir)  # a damaged record: one line now, not once a resume has changed the manifest
        path = self.root / ".lock"
        try:
            fd = open_nofollow(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:  # a read-only folder fails here, before check_writable
            raise UserError(f"results folder {self.root} is not writable: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise UserError(f"{self.root} is in use by another run (lock held): not writing to it") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def check_writable(self) -> None:
        try:
            probe_writable(self.root)
        except OSError as exc:
            raise UserError(f"results folder {self.root} is not writable: {exc.strerror}") from None

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- writing ------------------------------------------------------------------------------
    def write_manifest(self, manifest: dict[str, Any]) -> None:
        self._guarded(lambda: write_json_atomic(self.root / MANIFEST, manifest))

    def update_manifest(self, **fields: Any) -> None:
        m = self.manifest()
        m.update(fields)
        self.write_manifest(m)

    def save_model_config(self, model_path: str) -> None:
        """Keep the model's config.json in the run folder (its geometry is the HBM floor's input)."""
        src = Path(model_path) / "config.json"
        if src.is_file():
            real_dir(self.root, Path(MODEL_CONFIG).parent.name)
            self._guarded(lambda: write_atomic(self.root / MODEL_CONFIG, src.read_bytes()))

    def write_plan(self, cells: list[dict[str, Any]]) -> None:
        self._guarded(lambda: write_json_atomic(self.root / PLAN, cells))

    def append(self, name: str, row: Mapping[str, Any]) -> None:
        """Append one row and fsync it: a crash after this returns cannot lose the row. Rows are
        built by formats.cell_row / request_row; a bare dict gets the file kind's version."""
        if name not in KIND:  # a writer's bug: say which files the store knows, not a bare KeyError
            raise ValueError(f"RunStore.append: {name!r} is not a row file the store knows ({', '.join(KIND)})")
        row = {"schema_version": formats.VERSIONS[KIND[name]], **row}
        line = (json.dumps(row, default=str) + "\n").encode()

        def do() -> None:
            f = self._files.get(name)
            if f is None:
                path = self.root / name
                _set_aside_torn_tail(path)
                f = self._files[name] = open_append(path)
            f.write(line)
            os.fsync(f.fileno())

        self._guarded(do)

    def void_rows(self, cell_id: str, attempt: str, why: str) -> None:
        """Mark the request rows of a voided attempt of a cell in the rows themselves: `voided` (why) and
        `valid: false`, so a reader filtering on `valid` never counts them (the attempt match keeps them
        out as well, and is all an older folder has). The only rewrite of requests.jsonl: by rename,
        every other line byte for byte, each row of the attempt once."""
        path = self.root / REQUESTS
        if not path.is_file():
            return
        f = self._files.pop(REQUESTS, None)
        if f is not None:
            f.close()  # the next append opens the new file
        _set_aside_torn_tail(path)
        lines = path.read_bytes().splitlines(keepends=True)
        hits = 0
        for i, raw in enumerate(lines):
            if cell_id.encode() not in raw:
                continue
            try:
                row = json.loads(raw)
            except ValueError:
                continue  # a damaged line is the readers' to name, never rewritten here
            if row.get("cell_id") != cell_id or row.get("attempt") != attempt or row.get("voided"):
                continue
            reason = row.get("invalid_reason") or f"attempt voided: {why}"
            lines[i] = (json.dumps({**row, "valid": False, "invalid_reason": reason, "voided": why}) + "\n").encode()
            hits += 1
        if hits:
            self._guarded(lambda: write_atomic(path, b"".join(lines)))

    def _guarded(self, fn: Any) -> None:
        try:
            fn()
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise UserError(f"disk full while writing to {self.root}: stopping; rows so far are kept") from None
            if exc.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
                raise UserError(f"results folder {self.root} is not writable: {exc.strerror}") from None
            raise

    # -- reading ------------------------------------------------------------------------------
    def manifest(self) -> dict[str, Any]:
        return formats.read_manifest(_read_json(self.root / MANIFEST), str(self.root / MANIFEST))

    def plan(self) -> list[dict[str, Any]]:
        return formats.read_plan(_read_json(self.root / PLAN), str(self.root / PLAN))

    def cells(self) -> list[CellRowDict]:
        rows = formats.read_rows("cells", read_jsonl(self.root / CELLS), str(self.root / CELLS))
        return cast(list[CellRowDict], rows)  # checked by formats.CellRow

    def requests(self) -> list[RequestRowDict]:
        rows = formats.read_rows("requests", read_jsonl(self.root / REQUESTS), str(self.root / REQUESTS))
        return cast(list[RequestRowDict], rows)  # checked by formats.RequestRow

    def profiles(self) -> list[dict[str, Any]]:
        """Kernel profiles (profiles.jsonl); none in a folder from before them or with profiling off."""
        return profiles_of(self.root)

    def finished_cell_ids(self) -> set[str]:
        return {r["cell_id"] for r in self.cells()}

    def log_path(self, name: str) -> Path:
        """logs/<name>.log; the server opens it without following a link (e2e/serve/server.py)."""
        file = f"{plain(name, 'a log name')}.log"  # checked before the folder is made
        return real_dir(self.root, "logs") / file

    def cell_dir(self, key: str) -> Path:
        """cells/<key>/: a server group's routing records and GPU readings."""
        return real_dir(self.root, "cells", plain(key, "a server key"))

    def attempts_used(self, key: str) -> int:
        """How many server attempts of `key` have left files here (logs/<key>.aN.log, cells/<key>/
        {gpu,records}-aN): a resumed run numbers its next attempt past them, so no attempt's log,
        readings or records are ever appended to another's."""
        logs, cells = self.root / "logs", self.root / "cells" / plain(key, "a server key")
        used = [
            int(m[1])
            for f in (logs.iterdir() if logs.is_dir() else [])
            if (m := re.fullmatch(rf"{re.escape(key)}\.a(\d+)\.log", f.name))
        ]
        used += [int(m[2]) for f in (cells.iterdir() if cells.is_dir() else []) if (m := ATTEMPT_DIR.match(f.name))]
        return max(used, default=-1) + 1


def profiles_of(root: Path) -> list[dict[str, Any]]:
    """A run folder's profiles.jsonl rows, checked (formats.ProfileRow); [] when it has none."""
    return formats.read_rows("profiles", read_jsonl(Path(root) / PROFILES), str(Path(root) / PROFILES))


def plain(name: str, what: str) -> str:
    """name, when it is a plain name: what becomes a file or folder name in the run folder never
    leads out of it (the readers refuse such a field first, formats.PlainName)."""
    if not is_plain_name(name):
        raise UserError(f"{what} {name!r} is not a plain name: nothing in a run folder is a path")
    return name


def inside(root: Path, rel: Any) -> Path | None:
    """root/rel when `rel`, read from a record in the run folder (a live server's `log`), is a path
    inside it (plain names joined by '/', formats.InsidePath) and names a regular file there, no link
    on the way; None otherwise: a record is data, and what it names outside is never touched."""
    if not isinstance(rel, str) or not formats.is_inside_path(rel):
        return None
    path = Path(root)
    for part in rel.split("/"):
        path = path / part
        if path.is_symlink():
            return None
    return path if path.is_file() else None


def voided(server_dir: Path) -> list[dict[str, Any]]:
    """The attempts of one server group that `retry` voided (cells/<server>/gpu-a<n>/voided.json),
    each checked (formats.VoidedAttempt): one line naming a damaged one."""
    return [formats.read_voided(_read_json(f), str(f)) for f in sorted(Path(server_dir).glob(f"gpu-a*/{VOIDED}"))]


def counted_requests(cells: Iterable[Mapping[str, Any]], requests: Iterable[Row]) -> Iterator[Row]:
    """Request rows that belong to the recorded attempt of a finished cell (never a dead attempt, nor a
    row marked voided), and are its timed rounds (never a server's closing "bookend" rounds,
    e2e/stats/bookends.py)."""
    attempts = {(c["cell_id"], c["attempt"]) for c in cells}
    for r in requests:
        if (r["cell_id"], r["attempt"]) in attempts and r.get("phase") != "bookend" and not r.get("voided"):
            yield r


# -- the run folder's status as a reader should state it -----------------------------------------
def harness_gone(run_root: Path) -> bool:
    """True when nothing holds the run folder's lock: no harness is writing there."""
    import fcntl

    try:
        fd = os.open(Path(run_root) / ".lock", os.O_RDONLY)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing releases the probe's own lock


FINISHED = ("complete", "complete-with-failures")  # what session.finish writes at a run's end


def effective_status(run_root: Path, status: Any) -> Any:
    """A manifest's status as a reader should state it: `running` with no harness holding the
    folder is `harness-died` (killed, or its machine went down, before it could say so)."""
    return "harness-died" if status == "running" and harness_gone(run_root) else status
