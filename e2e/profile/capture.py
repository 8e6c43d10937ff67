"""A cell's profile, taken on its own server after the server's timed and bookend rounds: one untimed
profiled round of the long request and one of the short (the same lengths and batch as the timing),
each between POST /start_profile and POST /stop_profile, its workers' traces read (trace.py) and
differenced into a decode step (steps.py). Never raises for what a profile can meet (a server without
the profiler, a failed round, a trace that is not JSON, a folder that cannot be written): the row says
`missing` and why in one line, and the cells' rows, written before, are untouched."""

from __future__ import annotations

import gzip
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from e2e.profile import steps
from e2e.profile.trace import Totals, TraceError, read_totals

TRACE_GLOB = "*.pt.trace.json*"
TRACE_WAIT_S = 120.0  # the workers write their traces as /stop_profile returns; a big one takes seconds
CONTROL_TIMEOUT_S = 300.0  # /stop_profile returns once the workers have written their traces


class Missing(Exception):
    """Why a cell has no profile: one line."""


def _traces(folder: Path) -> set[Path]:
    return {p for p in folder.glob(TRACE_GLOB) if p.is_file()}


class ServerProfiler:
    """vLLM's profiler on one started server, its workers writing to trace_dir."""

    def __init__(self, base_url: str, api_key: str, trace_dir: Path, workers: int):
        self.http = httpx.Client(
            base_url=base_url, timeout=CONTROL_TIMEOUT_S, headers={"Authorization": f"Bearer {api_key}"}
        )
        self.trace_dir = trace_dir
        self.workers = workers

    def close(self) -> None:
        self.http.close()

    def _post(self, path: str) -> None:
        try:
            r = self.http.post(path)
        except httpx.HTTPError as exc:
            raise Missing(f"{path}: {type(exc).__name__}") from None
        if r.status_code == 404:
            raise Missing(f"{path}: 404: this server has no profiler (its vLLM did not take the profiler config)")
        if r.status_code != 200:
            raise Missing(f"{path}: HTTP {r.status_code}: {r.text[:120]}")

    def round(self, send: Callable[[int], str | None], n: int) -> tuple[list[Path], float]:
        """One profiled round of length n: its workers' new trace files and the round's wall seconds."""
        before = _traces(self.trace_dir)
        self._post("/start_profile")
        t0 = time.monotonic()
        try:
            problem = send(n)
        finally:
            wall = time.monotonic() - t0
            self._post("/stop_profile")
        new = self._wait_new(before)
        if problem:
            _remove(new)
            raise Missing(f"the profiled round of {n} tokens failed: {problem}")
        return new, wall

    def _wait_new(self, before: set[Path]) -> list[Path]:
        """The trace files the stop wrote: one per worker, sizes steady for one poll."""
        deadline, sizes = time.monotonic() + TRACE_WAIT_S, None
        while True:
            new = sorted(_traces(self.trace_dir) - before)
            now_sizes = [p.stat().st_size for p in new]
            if len(new) >= self.workers and now_sizes == sizes:
                return new
            if time.monotonic() > deadline:
                if new:
                    return new
                raise Missing(f"the profiler wrote no trace to {self.trace_dir.name}/ within {TRACE_WAIT_S:g} s")
            sizes = now_sizes
            time.sleep(0.5)


def _remove(paths: list[Path]) -> None:
    for p in paths:
        p.unlink(missing_ok=True)


def _keep(paths: list[Path], dest: Path, prefix: str) -> list[Path]:
    """The round's traces moved to dest/<prefix>.<name>, gzipped."""
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for p in paths:
        # a run folder holds plain names only (formats.InsidePath): a worker name vLLM took from a host is not
        target = dest / re.sub(r"[^A-Za-z0-9_.-]", "_", f"{prefix}.{p.name}")
        if p.name.endswith(".gz"):
            shutil.move(p, target)
        else:
            target = target.with_name(target.name + ".gz")
            with open(p, "rb") as src, gzip.open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            p.unlink()
        out.append(target)
    return out


def profile_cell(
    prof: ServerProfiler,
    send: Callable[[int], str | None],
    long_tokens: int,
    short_tokens: int,
    trace: str,
    cap_mib: float,
    dest: Path,
    root: Path,
) -> dict[str, Any]:
    """The profile row's fields for one cell (status ok, or missing and why). trace "gz" keeps the
    round's traces under dest when their total is within cap_mib, "none" keeps none."""
    found: dict[int, Totals] = {}
    files: list[Path] = []
    wall: dict[str, float] = {}
    note = None
    try:
        for label, n in (("long", long_tokens), ("short", short_tokens)):
            new, wall[label] = prof.round(send, n)
            try:
                found[n] = read_totals(new)
            finally:
                if trace == "gz":
                    files += _keep(new, dest, label)
                else:
                    _remove(new)
    except (Missing, TraceError) as exc:
        _remove(files)
        return {"status": "missing", "reason": str(exc)}
    except OSError as exc:
        _remove(files)
        return {"status": "missing", "reason": f"trace files: {exc.strerror or exc}"}
    size = sum(p.stat().st_size for p in files)
    if size > cap_mib * (1 << 20):
        _remove(files)
        note = f"traces not kept: {size / (1 << 20):.1f} MiB over the {cap_mib:g} MiB cap"
        files = []
    step = steps.per_step(found[long_tokens], found[short_tokens], long_tokens, short_tokens)
    return {
        "status": "ok",
        **step,
        "long_tokens": long_tokens,
        "short_tokens": short_tokens,
        "round_s": wall,
        "traces": [str(p.relative_to(root)) for p in files],
        **({"note": note} if note else {}),
    }
