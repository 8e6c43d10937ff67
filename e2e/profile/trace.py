"""A torch profiler chrome trace (what vLLM's `--profiler-config` writes: `*.pt.trace.json[.gz]`, one
per worker) read into per-name totals: calls and microseconds.

Device kernels when the trace has any (categories "kernel", "gpu_memcpy", "gpu_memset": CUDA and ROCm,
kernels inside CUDA-graph replays included); otherwise CPU ops (category "cpu_op", the CPU lane), whose
time is each op's SELF time (its span less its direct children's on the same thread): ops nest
(aten::linear holds aten::addmm), and self times partition a thread's op time without counting twice."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
CPU_CATEGORY = "cpu_op"
# A 64-token round of the 27B twin is 5 MB gzipped (~60 MB of JSON); a cap far above that keeps a
# runaway file from taking the host's memory.
TRACE_MAX_BYTES = 1 << 30


class TraceError(ValueError):
    """A trace that cannot be read: one line, naming the file."""


@dataclass
class Totals:
    """Per name: calls and microseconds, and which kind of event they came from."""

    source: str  # "device kernels" | "cpu ops"
    calls: dict[str, int] = field(default_factory=dict)
    us: dict[str, float] = field(default_factory=dict)

    def add(self, other: Totals) -> None:
        """Another worker's totals (tensor parallel: one trace per rank) into these."""
        for k, n in other.calls.items():
            self.calls[k] = self.calls.get(k, 0) + n
            self.us[k] = self.us.get(k, 0.0) + other.us[k]


def read_events(path: Path) -> list[dict[str, Any]]:
    """The trace's events; TraceError (one line) for a file that is not a chrome trace."""
    try:
        with open(path, "rb") as raw:
            head = raw.read(2)
        opener: Any = gzip.open if head == b"\x1f\x8b" else open
        with opener(path, "rb") as f:
            data = f.read(TRACE_MAX_BYTES + 1)
    except (OSError, EOFError) as exc:
        raise TraceError(f"{path.name}: cannot read ({exc})") from None
    if len(data) > TRACE_MAX_BYTES:
        raise TraceError(f"{path.name}: over {TRACE_MAX_BYTES >> 20} MiB of JSON: not read")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise TraceError(f"{path.name}: not JSON ({str(exc).splitlines()[0][:80]})") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc if isinstance(doc, list) else None
    if not isinstance(events, list):
        raise TraceError(f"{path.name}: not a chrome trace (no traceEvents list)")
    return [e for e in events if isinstance(e, dict)]


def _complete(e: dict[str, Any]) -> bool:
    return e.get("ph") == "X" and isinstance(e.get("name"), str) and isinstance(e.get("dur"), (int, float))


def totals(events: list[dict[str, Any]]) -> Totals:
    """Per-name calls and microseconds: device kernels if there are any, else CPU ops' self time."""
    device = [e for e in events if _complete(e) and e.get("cat") in DEVICE_CATEGORIES]
    if device:
        out = Totals("device kernels")
        for e in device:
            out.calls[e["name"]] = out.calls.get(e["name"], 0) + 1
            out.us[e["name"]] = out.us.get(e["name"], 0.0) + float(e["dur"])
        return out
    return _cpu_self(e for e in events if _complete(e) and e.get("cat") == CPU_CATEGORY)


def _cpu_self(ops: Any) -> Totals:
    """Self time of nested ops, thread by thread: a sweep in start order with a stack of open ops."""
    out = Totals("cpu ops")
    threads: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for e in ops:
        threads[(e.get("pid"), e.get("tid"))].append(e)
    for evs in threads.values():
        evs.sort(key=lambda e: (float(e.get("ts", 0.0)), -float(e["dur"])))  # a parent before its first child
        stack: list[list[Any]] = []  # [end, name, self_us]
        for e in evs:
            ts, dur = float(e.get("ts", 0.0)), float(e["dur"])
            while stack and stack[-1][0] <= ts:
                _close(out, stack.pop())
            if stack:
                stack[-1][2] -= min(dur, stack[-1][0] - ts)  # the child's time is not the parent's own
            stack.append([ts + dur, e["name"], dur])
        while stack:
            _close(out, stack.pop())
    return out


def _close(out: Totals, op: list[Any]) -> None:
    name = op[1]
    out.calls[name] = out.calls.get(name, 0) + 1
    out.us[name] = out.us.get(name, 0.0) + max(op[2], 0.0)


def read_totals(paths: list[Path]) -> Totals:
    """The totals of one profiled round: every worker's trace, summed (TraceError from the first bad one)."""
    if not paths:
        raise TraceError("the profiler wrote no trace")
    got = [totals(read_events(p)) for p in sorted(paths)]
    out = Totals(got[0].source)
    for t in got:
        out.add(t)
    return out
