"""The values the docs quote (e2e/report/doc_figures.py), each a function of one committed run folder.

A value reads the folder through the project's own loaders (its summary.json, cells.jsonl,
requests.jsonl) and returns the numbers (or words) a figure's format prints; `Figure` pairs one with
its run folder and format, and e2e/report/doc_figure_registry.py names each by the id a page quotes.
"""

from __future__ import annotations

import functools
import json
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.design.point import Point
from e2e.rundir.manifest_model import RecordedConfig, recorded_config
from e2e.rundir.store import counted_requests, read_jsonl
from e2e.stats import estimate, stall
from e2e.stats.cells import cell_stats


class RunFolder:
    """One committed run folder, read once: its summary and its counted rows."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @functools.cached_property
    def summary(self) -> dict[str, Any]:
        return json.loads((self.path / "summary.json").read_text())

    @functools.cached_property
    def manifest(self) -> dict[str, Any]:
        """manifest.json as written (gpu_bandwidth, the registry's `.bw` figures); its config: `config`."""
        return json.loads((self.path / "manifest.json").read_text())

    @functools.cached_property
    def config(self) -> RecordedConfig:
        """The config the run recorded, typed, as every reader of a run folder takes it (UserError:
        malformed, a figure the check names as not recomputable)."""
        return recorded_config(self.manifest, str(self.path / "manifest.json"))

    @functools.cached_property
    def rounds(self) -> list[dict[str, Any]]:
        """The counted timed rounds (the recorded attempt of each finished cell, no bookend)."""
        cells = read_jsonl(self.path / "cells.jsonl")
        return [r for r in counted_requests(cells, read_jsonl(self.path / "requests.jsonl")) if r.get("valid")]

    @functools.cached_property
    def cell_rows(self) -> list[dict[str, Any]]:
        """cells.jsonl as written: a cell the report leaves out (the stall check) keeps its row here."""
        return read_jsonl(self.path / "cells.jsonl")

    def comparison(self, arm: str, depth: int, c: int = 1) -> dict[str, Any]:
        return _one(self.summary["comparisons"], arm, depth, c, scope="pooled")

    def load(self, arm: str, depth: int, c: int = 1) -> dict[str, Any]:
        return _one(self.summary["load"], arm, depth, c)

    def cells(self, arm: str, depth: int, c: int = 1) -> list[dict[str, Any]]:
        return [x for x in self.summary["cells"] if _at(x, arm, depth, c) and x.get("estimate_ms") is not None]


def _at(row: dict[str, Any], arm: str, depth: int, c: int) -> bool:
    return row.get("arm") == arm and Point.of(row) == Point(depth, c)


def _one(rows: Iterable[dict[str, Any]], arm: str, depth: int, c: int, **match: Any) -> dict[str, Any]:
    hits = [r for r in rows if _at(r, arm, depth, c) and all(r.get(k) == v for k, v in match.items())]
    if len(hits) != 1:
        raise LookupError(f"{len(hits)} rows for {arm} at {Point(depth, c)}")
    return hits[0]


@dataclass(frozen=True)
class Figure:
    run: str  # the folder under results/
    value: Callable[[RunFolder], Sequence[Any]]  # numbers (or words) for the format
    fmt: str  # str.format over the values: its precision is the check's

    def render(self, results: Path) -> str:
        return self.fmt.format(*self.value(RunFolder(results / self.run)))


# -- the values, each a function of one run folder -------------------------------------------------
RATIO_KEYS = ("ratio", "ratio_ci_lo", "ratio_ci_hi")


def comparison_keys(arm: str, depth: int, keys: Sequence[str], c: int = 1) -> Callable[[RunFolder], Sequence[float]]:
    """Keys of the arm's pooled comparison at the point (summary.json's `comparisons`)."""
    return lambda r: [r.comparison(arm, depth, c)[k] for k in keys]


def ratio(arm: str, depth: int, c: int = 1) -> Callable[[RunFolder], Sequence[float]]:
    """The pooled ratio against the reference arm and its 95 % interval."""
    return comparison_keys(arm, depth, RATIO_KEYS, c)


def mde(arm: str, depth: int, c: int = 1) -> Callable[[RunFolder], Sequence[float]]:
    return lambda r: [r.comparison(arm, depth, c)["mde_pct"]]


def grid_mdes(arm: str, depth: int, c: int = 1) -> Callable[[RunFolder], Sequence[float]]:
    """A grid folder's drawn row at the point (grid.json): its run's own MDE, then the joint family's."""

    def value(r: RunFolder) -> Sequence[float]:
        rows = json.loads((r.path / "grid.json").read_text())["rows"]
        [row] = [x for x in rows if x["drawn"] and _at(x, arm, depth, c)]
        return [row["mde_pct"], row["grid_mde_pct"]]

    return value


def step(arm: str, depth: int, c: int = 1) -> Callable[[RunFolder], Sequence[float]]:
    """The decode step at the point: the variance model's mean over the servers (ms)."""
    return lambda r: [r.load(arm, depth, c)["step_ms"]]


def _arms(arm: str | tuple[str, ...]) -> tuple[str, ...]:
    return (arm,) if isinstance(arm, str) else arm


def cell_span(
    arm: str | tuple[str, ...], depth: int, c: int = 1, key: str = "estimate_ms"
) -> Callable[[RunFolder], Sequence[float]]:
    """The smallest and largest over the point's cells of one or more arms (a cell's own estimate, or
    another cell key: `server_estimate_ms` is the server's own decode per step)."""

    def f(r: RunFolder) -> Sequence[float]:
        xs = [x[key] for a in _arms(arm) for x in r.cells(a, depth, c) if x.get(key) is not None]
        return [min(xs), max(xs)]

    return f


def cell_mean(arm: str, depth: int, c: int = 1, key: str = "estimate_ms") -> Callable[[RunFolder], Sequence[float]]:
    return lambda r: [statistics.fmean(x[key] for x in r.cells(arm, depth, c))]


def raw_cell_mean(
    arm: str, points: Sequence[tuple[int, int]], key: str, passes: Sequence[int] = (1, 2)
) -> Callable[[RunFolder], Sequence[float]]:
    """The mean of a cells.jsonl key over the arm's cells at the points and passes, read as written
    (so a cell the report leaves out still counts)."""

    def f(r: RunFolder) -> Sequence[float]:
        xs = [
            x[key]
            for x in r.cell_rows
            if x["arm"] == arm and Point.of(x) in [Point(*p) for p in points] and x["pass"] in passes
            if x.get(key) is not None
        ]
        return [statistics.fmean(xs)]

    return f


def cells_by_pass(arm: str, depth: int, key: str = "estimate_ms") -> Callable[[RunFolder], Sequence[float]]:
    """The point's cells in pass order (a report's per-cell column)."""
    return lambda r: [x[key] for x in sorted(r.cells(arm, depth), key=lambda x: x["pass"])]


def _cell_rounds(r: RunFolder, arm: str, depth: int) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for x in r.rounds:
        if _at(x, arm, depth, 1):
            out.setdefault(x["cell_id"], []).append(x)
    return out


def _tokens(r: RunFolder) -> tuple[int, int]:
    return r.summary["run"]["long_tokens"], r.summary["run"]["short_tokens"]


def half_widths(arms: tuple[str, ...], depth: int, estimator: str) -> Callable[[RunFolder], Sequence[float]]:
    """The smallest and largest 95 % half-width (%) of the arms' cells at a batch-1 depth, each cell
    recomputed from its rounds under `estimator` (e2e.stats.cells.cell_stats)."""

    def f(r: RunFolder) -> Sequence[float]:
        hw = [
            100 * h
            for a in arms
            for rows in _cell_rounds(r, a, depth).values()
            if (h := cell_stats(rows, *_tokens(r), estimator=estimator).half_width_rel) is not None
        ]
        return [min(hw), max(hw)]

    return f


def mixed_ratio(arm: str, arm_est: str, ref: str, ref_est: str, depth: int) -> Callable[[RunFolder], Sequence[float]]:
    """arm / ref as the geometric means of their cells, each arm on its own estimator (what one
    estimator per point prevents)."""

    def gm(r: RunFolder, a: str, est: str) -> float:
        xs = [estimate.estimator_ms(rows, *_tokens(r), est) for rows in _cell_rounds(r, a, depth).values()]
        return statistics.geometric_mean([x for x in xs if x is not None])

    return lambda r: [gm(r, arm, arm_est) / gm(r, ref, ref_est)]


def arm_geomean(arm: str, depth: int, c: int = 1) -> Callable[[RunFolder], Sequence[float]]:
    """The arm's geometric mean over its cells at the point (summary.json's `arms`, ms)."""
    return lambda r: [_one(r.summary["arms"], arm, depth, c)["geomean_ms"]]


def stalled_rounds(r: RunFolder) -> list[tuple[float, float]]:
    """(unexplained ms, in decode steps) of every counted round at c > 1 the stall check refuses."""
    run = r.summary["run"]
    w = r.config.workload
    if w.long_tokens is None or w.short_tokens is None:  # as a missing key was: a figure it cannot give
        raise LookupError(f"{r.path}: its manifest records no workload.long_tokens or short_tokens")
    line = stall.line_steps(w.long_tokens, w.short_tokens, run["min_effect_pct"])  # the run's own line
    out = []
    for x in r.rounds:
        if Point.of(x).concurrency > 1 and stall.stall_problem(x, x["n_tokens"], line):
            gap = stall.unexplained_s(x)
            assert gap is not None  # a refused round has one
            out.append((1e3 * gap, gap / (x["server_decode_s"] / (x["n_tokens"] - 1))))
    return out


def stalled_ms(r: RunFolder) -> Sequence[float]:
    gaps = [g for g, _ in stalled_rounds(r)]
    return [min(gaps), max(gaps)]


def stalled_steps(r: RunFolder) -> Sequence[float]:
    steps = [s for _, s in stalled_rounds(r)]
    return [min(steps), max(steps)]


def round_span(arm: str | tuple[str, ...], depth: int, c: int, key: str) -> Callable[[RunFolder], Sequence[float]]:
    """The smallest and largest of a server key over the point's counted rounds (s -> ms)."""

    def f(r: RunFolder) -> Sequence[float]:
        xs = [1e3 * x[key] for x in r.rounds for a in _arms(arm) if _at(x, a, depth, c) and x.get(key) is not None]
        return [min(xs), max(xs)]

    return f


def client_over_server(arm: str, depth: int, c: int, cell: str | None = None) -> Callable[[RunFolder], Sequence[float]]:
    """How far the client's differenced step reads over the server's own decode, in %: the point's
    mean over its cells, or one cell's."""

    def f(r: RunFolder) -> Sequence[float]:
        xs = [x for x in r.cells(arm, depth, c) if cell is None or x["cell_id"] == cell]
        return [100 * statistics.fmean(x["estimate_ms"] / x["server_estimate_ms"] - 1 for x in xs)]

    return f


def ratio_span_over_runs(runs: Sequence[str], arm: str, depth: int) -> Callable[[RunFolder], Sequence[float]]:
    """The smallest and largest pooled ratio of the arm at the point over several runs beside the folder."""

    def f(r: RunFolder) -> Sequence[float]:
        xs = [RunFolder(r.path.parent / run).comparison(arm, depth)["ratio"] for run in runs]
        return [min(xs), max(xs)]

    return f


def cell_span_over_runs(runs: Sequence[str], arm: str, depth: int) -> Callable[[RunFolder], Sequence[float]]:
    """A span over several runs' batch-1 cells (the folder given is the first; the rest beside it)."""

    def f(r: RunFolder) -> Sequence[float]:
        xs = [x["estimate_ms"] for run in runs for x in RunFolder(r.path.parent / run).cells(arm, depth)]
        return [min(xs), max(xs)]

    return f


def bandwidth(r: RunFolder) -> Sequence[float]:
    bw = r.manifest["gpu_bandwidth"]["best_gbps"]
    return [bw, 100 * bw / r.summary["roofline"]["bandwidth_gbps"]]


def _span_x(lo: float, hi: float) -> str:
    a, b = f"{min(lo, hi):.2f}", f"{max(lo, hi):.2f}"
    return f"{a}x" if a == b else f"{a}-{b}x"


def floors(arm: str, which: str) -> Callable[[RunFolder], Sequence[Any]]:
    """The arm's measured / HBM-floor ratio per depth (its cells' span): which = 'measured_over_floor'
    (the datasheet's bandwidth) or 'measured_over_measured_floor' (the GPU's measured read bandwidth)."""
    return lambda r: [_span_x(*v[which][arm]) for v in r.summary["roofline"]["per_depth"].values()]


def starts(r: RunFolder) -> Sequence[Any]:
    """Per arm: its first (cold) start, the median of its later (warm) ones (s), warm / cold in %."""
    return [
        f"{s['arm']} {s['first_s']:.1f} / {s['later_median_s']:.1f} s ({100 * s['later_median_s'] / s['first_s']:.0f} %)"
        for s in r.summary["startups"]
    ]
