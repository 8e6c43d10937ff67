"""What a server group runs on its node: the run loop (e2e/run/runner.py, unchanged) against a store that
sends every row to the driver instead of writing the run folder.

Only the driver writes the run folder. On the node, a group works in a scratch folder
(<tmp>/e2e-ray-<uid>/<run>/): the servers' logs and routing records go to tasks/<group>/ and are
shipped to the driver when the group ends, the compile cache (vllm-cache/) is shared by the run's
groups on that node. Rows are sent as they are measured; `send` returns once the driver's inbox
holds the row, so the row order is the order measured.

Attempts are numbered over the whole life of a group: a group retried after its task was lost
(node gone, worker killed) starts at attempt `offset`, so its rows, log names and error texts
continue the count and never reuse the lost attempt's name.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from e2e.rundir.gpu_rows import VOIDED
from e2e.rundir.store import ATTEMPT_DIR, CELLS
from e2e.safety.redact import REDACTED
from e2e.serve.live_servers import scratch_root

Send = Callable[[tuple[Any, ...]], None]
_ATTEMPT = re.compile(r"^(\d+)-")
_ERROR_ATTEMPT = re.compile(r"\battempt (\d+):")


def shift_attempt(tag: str, offset: int) -> str:
    m = _ATTEMPT.match(tag)
    return f"{int(m[1]) + offset}-{tag[m.end() :]}" if m and offset else tag


def shift_errors(text: str | None, offset: int) -> str | None:
    if not text or not offset:
        return text
    return _ERROR_ATTEMPT.sub(lambda m: f"attempt {int(m[1]) + offset}:", text)


class NodeRoot(os.PathLike[str]):
    """The run root as the runner sees it on a node: paths under it are the node's scratch folder,
    but resolve() names the driver's run folder, so every server's E2E_SERVER_TAG says which run
    it belongs to (e2e/serve/launch.py start_server tags servers with f"{run_root.resolve()}::{key}")."""

    def __init__(self, scratch: Path, run_root: str):
        self.scratch = Path(scratch)
        self.run_root = run_root

    def __fspath__(self) -> str:
        return str(self.scratch)

    def __str__(self) -> str:
        return str(self.scratch)

    def resolve(self) -> str:
        return self.run_root


class NodeStore:
    """The part of RunStore the runner uses, on a node: rows go to the driver, files to scratch."""

    def __init__(self, run_root: str, task_dir: str, send: Send, offset: int = 0):
        self.root = NodeRoot(scratch_root(run_root), run_root)
        self.task = Path(self.root.scratch) / "tasks" / task_dir
        self.send = send
        self.offset = offset

    def finished_cell_ids(self) -> set[str]:
        return set()  # the driver sends only cells without a row

    def attempts_used(self, key: str) -> int:
        return 0  # a task's folder is new: `offset` numbers its attempts past the group's earlier ones

    def append(self, name: str, row: Mapping[str, Any]) -> None:
        self.send((name, self.shifted(name, row)))

    def void_rows(self, cell_id: str, attempt: str, why: str) -> None:
        self.send(("void", cell_id, shift_attempt(attempt, self.offset), shift_errors(why, self.offset)))

    def shifted(self, name: str, row: Mapping[str, Any]) -> dict[str, Any]:
        row = dict(row, attempt=shift_attempt(row["attempt"], self.offset))
        if name == CELLS:
            if row.get("log_path"):
                row["log_path"] = f"logs/{Path(row['log_path']).name}"
            row["error"] = shift_errors(row.get("error"), self.offset)
            # attempts named inside the row (e2e/gpu/gpu_state.py, e2e/stats/bookends.py) continue the count too
            if row.get("gpu_state"):
                row["gpu_state"] = {
                    **row["gpu_state"],
                    "contaminated_attempts": [
                        {**a, "attempt": shift_attempt(a["attempt"], self.offset)}
                        for a in row["gpu_state"].get("contaminated_attempts") or []
                    ],
                }
            if (row.get("bookend") or {}).get("server_attempt"):
                row["bookend"] = {
                    **row["bookend"],
                    "server_attempt": shift_attempt(row["bookend"]["server_attempt"], self.offset),
                }
        return row

    def log_path(self, name: str) -> Path:
        key, n = name.rsplit(".a", 1)
        return self.task / "logs" / f"{key}.a{int(n) + self.offset}.log"

    def cell_dir(self, key: str) -> Path:
        d = self.task / "cells" / key
        d.mkdir(parents=True, exist_ok=True)
        return d


class NodeProgress:
    """Progress events for the driver's console (it prints them; a node has no terminal)."""

    def __init__(self, send: Send, offset: int = 0):
        self.send = send
        self.offset = offset

    def start(self, total: int, done: int) -> None:
        pass

    def phase(self, cell: Any, phase: str) -> None:
        self.send(("phase", cell.index, phase))

    def note(self, text: str) -> None:
        self.send(("note", shift_errors(text, self.offset)))

    def cell_done(self, cell: Any, row: Mapping[str, Any]) -> None:
        pass  # the driver reports a cell when its row arrives

    def stop(self) -> None:
        pass


def task_files(task: Path, offset: int, secrets: frozenset[str] = frozenset()) -> dict[str, bytes]:
    """A task folder's logs and routing records, keyed by their path in the run folder (records
    renumbered by offset), logs scrubbed of the secrets a server could have printed: a server stop
    cut short by an interrupt may have left its log unscrubbed."""
    out: dict[str, bytes] = {}
    if not task.is_dir():
        return out
    for p in sorted(task.rglob("*")):
        if not p.is_file() or p.name.startswith("."):
            continue
        parts = list(p.relative_to(task).parts)
        for i, part in enumerate(parts):
            if m := ATTEMPT_DIR.match(part):
                parts[i] = f"{m[1]}-a{int(m[2]) + offset}"
        data = p.read_bytes()
        if p.name == VOIDED:  # the attempt it names is numbered as the rows are
            v = json.loads(data)
            data = (json.dumps({**v, "attempt": shift_attempt(v["attempt"], offset)}) + "\n").encode()
        if parts[0] == "logs":
            for s in sorted(secrets, key=len, reverse=True):
                data = data.replace(s.encode(), REDACTED.encode())
        out["/".join(parts)] = data
    return out


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
