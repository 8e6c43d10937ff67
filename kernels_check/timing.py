"""Device-event timing of one kernel launch, after warm-up; median of many.

Two figures per path:
- cold: each launch preceded by a write of a buffer larger than L2 (H200: 50 MB), timed alone
  between CUDA events. In a real decode step the KV of one layer is read once and other layers'
  traffic evicts it, so L2-cold is the faithful case. The flush write also keeps the GPU busy
  while Python enqueues the launch, so host overhead stays out of the events.
- graph: `inner` launches captured in one CUDA graph, replayed `reps` times; per launch = replay
  time / inner. No host overhead at all, L2 warm across launches: a lower bound that matters only
  at short contexts. None when capture fails (the reason is recorded).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch


def summarize(ms: list[float]) -> dict[str, Any]:
    """median, p10, p90 and n of a list of milliseconds (empty -> n 0)."""
    if not ms:
        return {"n": 0}
    xs = sorted(ms)

    def q(f: float) -> float:
        return xs[min(len(xs) - 1, int(round(f * (len(xs) - 1))))]

    return {"median_ms": statistics.median(xs), "p10_ms": q(0.1), "p90_ms": q(0.9), "n": len(xs)}


def _event() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)


def time_cold(launch: Callable[[], object], reps: int, flush: torch.Tensor, warmup: int = 3) -> list[float]:
    for _ in range(warmup):
        launch()
    starts = [_event() for _ in range(reps)]
    ends = [_event() for _ in range(reps)]
    for i in range(reps):
        flush.zero_()
        starts[i].record()
        launch()
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def time_graph(launch: Callable[[], object], inner: int, reps: int, warmup: int = 3) -> list[float]:
    """Capture `inner` launches in one graph; per-launch ms of each of `reps` replays."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):  # warm-up on a side stream, as torch.cuda.graphs recommends
            launch()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            launch()
    graph.replay()
    torch.cuda.synchronize()
    starts = [_event() for _ in range(reps)]
    ends = [_event() for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        graph.replay()
        ends[i].record()
    torch.cuda.synchronize()
    del graph
    return [s.elapsed_time(e) / inner for s, e in zip(starts, ends)]
