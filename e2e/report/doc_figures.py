"""Figures the docs quote from committed runs, each recomputed from its run folder.

A doc writer marks a number (or a short phrase of numbers) where it is quoted:

    FA3 read <!-- fig:load32k.fa3.c1 -->11.33<!-- /fig --> ms per step

and registers the id in FIGURES below: the run folder under results/, a function of that folder
(its summary.json, cells.jsonl, requests.jsonl, through the project's own loaders) returning the
numbers, and the format that prints them. `check` fails when a marked text is not what its figure
prints now (the precision is the format's), names an id that is not registered, or a registered id
quoted nowhere; `update` rewrites the marked text and dates the correction in place, as the seed's
report does: "(corrected 2026-12-06: was X)". A new marker written as `<!-- fig:ID -->?<!-- /fig -->`
is filled without a correction note.

    python -m e2e.report.doc_figures check     # exit 1 naming each stale figure
    python -m e2e.report.doc_figures update    # rewrite them (dated), then review the diff

tests/guarantees/test_doc_figures.py runs `check` in CI.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import json
import re
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.rundir.store import counted_requests, read_jsonl
from e2e.stats import estimate, stall
from e2e.stats.cells import cell_stats
from e2e.stats.point import Point

ROOT = Path(__file__).resolve().parents[2]
# The pages that quote committed runs; every Markdown page under docs/ is read too.
PAGES = ("README.md", "results/README.md")
MARK = re.compile(r"<!-- fig:(?P<id>[A-Za-z0-9_./\-]+) -->(?P<text>.*?)<!-- /fig -->", re.S)
NEW = "?"


class RunFolder:
    """One committed run folder, read once: its summary and its counted rows."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @functools.cached_property
    def summary(self) -> dict[str, Any]:
        return json.loads((self.path / "summary.json").read_text())

    @functools.cached_property
    def manifest(self) -> dict[str, Any]:
        return json.loads((self.path / "manifest.json").read_text())

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
    w = r.manifest["config"]["workload"]
    line = stall.line_steps(w["long_tokens"], w["short_tokens"], run["min_effect_pct"])  # the run's own line
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


L1, L8, L32 = "h200-load-tp1", "h200-load-8k-tp1", "h200-load-32k-tp1"
K1, K8, K32 = 1024, 8192, 32768
RC = "{:.3f} ({:.3f} to {:.3f})"
FA3 = ("stock", "widened")  # both arms run FlashAttention 3 on NVIDIA (the widened gate is False)
FIGURES: dict[str, Figure] = {
    # results/h200-load-tp1: ROCM_ATTN / FA3 at 1K and 8K, 64 vs 8 tokens
    "load.rocm.1k.c1": Figure(L1, ratio("rocm-attn", K1, 1), RC),
    "load.rocm.1k.c4": Figure(L1, ratio("rocm-attn", K1, 4), RC),
    "load.rocm.1k.c16": Figure(L1, ratio("rocm-attn", K1, 16), RC),
    "load.rocm.1k.c32": Figure(L1, ratio("rocm-attn", K1, 32), RC),
    "load.rocm.8k.c1": Figure(L1, ratio("rocm-attn", K8, 1), RC),
    "load.rocm.8k.c4": Figure(L1, ratio("rocm-attn", K8, 4), RC),
    "load.rocm.1k.c1.x": Figure(L1, ratio("rocm-attn", K1, 1), "{:.2f}x"),
    "load.rocm.1k.c32.x": Figure(L1, ratio("rocm-attn", K1, 32), "{:.2f}x"),
    "load.rocm.8k.c1.x": Figure(L1, ratio("rocm-attn", K8, 1), "{:.2f}x"),
    "load.fa3.1k.c1": Figure(L1, step("stock", K1, 1), "{:.2f}"),
    "load.fa3.8k.c1": Figure(L1, step("stock", K8, 1), "{:.2f}"),
    "load.fa3.8k.c4": Figure(L1, step("stock", K8, 4), "{:.2f}"),
    "load.rocm.1k.c1.ms": Figure(L1, step("rocm-attn", K1, 1), "{:.1f}"),
    "load.rocm.8k.c1.ms": Figure(L1, step("rocm-attn", K8, 1), "{:.2f}"),
    "load.rocm.8k.c4.ms": Figure(L1, step("rocm-attn", K8, 4), "{:.1f}"),
    "load.fa3.8k.stalled.client": Figure(
        L1, raw_cell_mean("stock", [(K8, 16), (K8, 32)], "decode_ms_per_token", passes=(1,)), "{:.1f}"
    ),
    "load.fa3.8k.c16.server": Figure(L1, raw_cell_mean("stock", [(K8, 16)], "server_decode_ms_per_token"), "{:.1f}"),
    "load.fa3.8k.c32.server": Figure(L1, raw_cell_mean("stock", [(K8, 32)], "server_decode_ms_per_token"), "{:.1f}"),
    "load.stalled.ms": Figure(L1, stalled_ms, "{:.0f} to {:.0f} ms"),
    "load.stalled.steps": Figure(L1, stalled_steps, "{:.2f} to {:.2f}"),
    "load.rocm.1k.c16.client": Figure(L1, client_over_server("rocm-attn", K1, 16), "{:+.1f} %"),
    "load.rocm.1k.c16.client.p1": Figure(
        L1, client_over_server("rocm-attn", K1, 16, "p1-d1024-c16-rocm-attn"), "{:+.1f} %"
    ),
    "load.tput.1k.c32": Figure(
        L1,
        lambda r: [r.load("rocm-attn", K1, 32)["tokens_per_s"], r.load("stock", K1, 32)["tokens_per_s"]],
        "{1:.0f} tokens/s against {0:.0f}",
    ),
    # results/h200-load-8k-tp1: 8K again, 128 vs 32 tokens
    "load8k.rocm.c4": Figure(L8, ratio("rocm-attn", K8, 4), RC),
    "load8k.rocm.c16": Figure(L8, ratio("rocm-attn", K8, 16), RC),
    "load8k.rocm.c32": Figure(L8, ratio("rocm-attn", K8, 32), RC),
    "load8k.rocm.c4.x": Figure(L8, ratio("rocm-attn", K8, 4), "{:.2f}"),
    "load8k.rocm.c16.x": Figure(L8, ratio("rocm-attn", K8, 16), "{:.2f}"),
    "load8k.rocm.c32.x": Figure(L8, ratio("rocm-attn", K8, 32), "{:.2f}"),
    "load8k.fa3.steps": Figure(
        L8, lambda r: [r.load("stock", K8, c)["step_ms"] for c in (4, 16, 32)], "{:.2f} / {:.2f} / {:.2f}"
    ),
    "load8k.fa3.server": Figure(
        L8,
        lambda r: [cell_mean("stock", K8, c, "server_estimate_ms")(r)[0] for c in (4, 16, 32)],
        "{:.1f} / {:.1f} / {:.1f}",
    ),
    "load8k.fa3.c16": Figure(L8, step("stock", K8, 16), "{:.2f}"),
    "load8k.fa3.c16.server": Figure(L8, cell_mean("stock", K8, 16, "server_estimate_ms"), "{:.2f}"),
    "load8k.fa3.c4": Figure(L8, step("stock", K8, 4), "{:.2f}"),
    "load8k.rocm.c4.ms": Figure(L8, step("rocm-attn", K8, 4), "{:.1f}"),
    "load8k.mde": Figure(
        L8,
        lambda r: [
            min(mde("rocm-attn", K8, c)(r)[0] for c in (4, 16, 32)),
            max(mde("rocm-attn", K8, c)(r)[0] for c in (4, 16, 32)),
        ],
        "{:.1f}-{:.1f} %",
    ),
    # results/h200-load-32k-tp1: 32K, 64 vs 32 tokens, --disable-hybrid-kv-cache-manager
    "load32k.rocm.c1": Figure(L32, ratio("rocm-attn", K32, 1), RC),
    "load32k.rocm.c4": Figure(L32, ratio("rocm-attn", K32, 4), RC),
    "load32k.rocm.c1.x": Figure(L32, ratio("rocm-attn", K32, 1), "{:.2f}x"),
    "load32k.rocm.c4.x": Figure(L32, ratio("rocm-attn", K32, 4), "{:.2f}x"),
    "load32k.widened.c1": Figure(L32, ratio("widened", K32, 1), RC),
    "load32k.widened.c4": Figure(L32, ratio("widened", K32, 4), RC),
    "load32k.widened.c1.r": Figure(L32, ratio("widened", K32, 1), "{:.3f}"),
    "load32k.widened.c4.r": Figure(L32, ratio("widened", K32, 4), "{:.3f}"),
    "load32k.widened.mde": Figure(
        L32, lambda r: [mde("widened", K32, 1)(r)[0], mde("widened", K32, 4)(r)[0]], "MDE {:.1f} % and {:.1f} %"
    ),
    "load32k.fa3.c1": Figure(L32, step("stock", K32, 1), "{:.2f}"),
    "load32k.fa3.c4": Figure(L32, step("stock", K32, 4), "{:.2f}"),
    "load32k.rocm.c1.ms": Figure(L32, step("rocm-attn", K32, 1), "{:.1f}"),
    "load32k.rocm.c4.ms": Figure(L32, step("rocm-attn", K32, 4), "{:.1f}"),
    "load32k.fa3.c4.hw": Figure(L32, cell_span(FA3, K32, 4, "half_width_pct"), "+-{:.1f} to {:.1f} %"),
    "load32k.fa3.c4.ttft": Figure(L32, round_span(FA3, K32, 4, "server_ttft_s"), "{:.0f} to {:.0f} ms"),
    "load32k.fa3.c1.ttft": Figure(L32, round_span(FA3, K32, 1, "server_ttft_s"), "{:.0f}-{:.0f}"),
    "load32k.fa3.c4.prefill": Figure(L32, round_span(FA3, K32, 4, "server_prefill_s"), "{:.0f}-{:.0f} ms"),
    "load32k.rocm.c4.ttft": Figure(L32, round_span("rocm-attn", K32, 4, "server_ttft_s"), "{:.0f} to {:.0f} ms"),
    "load32k.rocm.c1.ttft": Figure(L32, round_span("rocm-attn", K32, 1, "server_ttft_s"), "{:.0f}-{:.0f}"),
    "load32k.stock.server": Figure(
        L32,
        lambda r: [
            *cell_span("stock", K32, 1, "server_estimate_ms")(r),
            *cell_span("stock", K32, 4, "server_estimate_ms")(r),
        ],
        "{:.2f}-{:.2f} and {:.2f}-{:.2f}",
    ),
    "load32k.fa3.c1.server": Figure(L32, cell_span(FA3, K32, 1, "server_estimate_ms"), "{:.2f}-{:.2f} ms"),
    "load32k.rocm.c1.ms2": Figure(L32, step("rocm-attn", K32, 1), "{:.2f}"),
    "load32k.rocm.c4.ms2": Figure(L32, step("rocm-attn", K32, 4), "{:.2f}"),
    "load32k.rocm.mde": Figure(
        L32, lambda r: [mde("rocm-attn", K32, 1)(r)[0], mde("rocm-attn", K32, 4)(r)[0]], "MDE {:.1f} %, {:.1f} %"
    ),
}


def _ratio_span_all(runs: Sequence[str], arm: str, depth: int) -> Callable[[RunFolder], Sequence[float]]:
    """The smallest and largest pooled ratio of the arm at the point over several runs beside the folder."""

    def f(r: RunFolder) -> Sequence[float]:
        xs = [RunFolder(r.path.parent / run).comparison(arm, depth)["ratio"] for run in runs]
        return [min(xs), max(xs)]

    return f


def _cell_span_all(runs: Sequence[str], arm: str, depth: int) -> Callable[[RunFolder], Sequence[float]]:
    """A span over several runs' batch-1 cells (the folder given is the first; the rest beside it)."""

    def f(r: RunFolder) -> Sequence[float]:
        xs = [x["estimate_ms"] for run in runs for x in RunFolder(r.path.parent / run).cells(arm, depth)]
        return [min(xs), max(xs)]

    return f


FIGURES["ref.rocm-attn.8k.client"] = Figure(
    "h200-reference-tp1", cells_by_pass("rocm-attn", K8, "client_estimate_ms"), "{:.2f}, {:.2f}"
)
FIGURES["ref.rocm-attn.32k.mean"] = Figure(
    "h200-reference-tp1", cell_mean("rocm-attn", K32, 1, "client_estimate_ms"), "{:.0f}"
)
for _arm in ("stock", "rocm-attn"):
    for _d, _k in ((K1, "1k"), (K8, "8k")):
        FIGURES[f"ref.{_arm}.{_k}.mean"] = Figure(
            "h200-reference-tp1", arm_geomean(_arm, _d), "{:.2f}" if _arm == "stock" else "{:.1f}"
        )
# The batch-1 H200 runs' per-cell tables (docs/results/index.md): each arm's cells in pass order,
# on the estimate each table states (the reference and TRITON_ATTN tables: the plain client estimate,
# as first reported; precision: today's).
for _tag, _run, _names, _key in (
    ("ref", "h200-reference-tp1", ("stock", "widened", "rocm-attn"), "client_estimate_ms"),
    ("prec", "h200-precision-tp1", ("stock", "widened"), "estimate_ms"),
    ("triton", "h200-triton-tp1", ("stock", "triton-attn"), "client_estimate_ms"),
):
    _n = 3 if _tag == "prec" else 2
    for _arm in _names:
        for _d, _k in ((K1, "1k"), (K8, "8k"), (K32, "32k")):
            FIGURES[f"{_tag}.{_arm}.{_k}.cells"] = Figure(
                _run, cells_by_pass(_arm, _d, _key), ", ".join(["{:.2f}"] * _n)
            )
for _d, _k in ((K1, "1k"), (K8, "8k"), (K32, "32k")):
    FIGURES[f"prec.widened.{_k}"] = Figure(
        "h200-precision-tp1",
        comparison_keys("widened", _d, RATIO_KEYS + ("ci_half_width_pct",)),
        "{:.3f} ({:.3f}-{:.3f}), +-{:.2f} %",
    )
    FIGURES[f"prec.widened.{_k}.df"] = Figure("h200-precision-tp1", comparison_keys("widened", _d, ("df",)), "{:.1f}")
    FIGURES[f"prec.widened.{_k}.mde"] = Figure("h200-precision-tp1", mde("widened", _d), "{:.1f} %")
# docs/concepts/estimator.md: why the prefill-corrected estimate (h200-reference-tp1, FA3's cells)
for _est, _e in ((estimate.CLIENT, "plain"), (estimate.CORRECTED, "corrected")):
    for _d, _k in ((K1, "1k"), (K8, "8k"), (K32, "32k")):
        FIGURES[f"est.hw.{_e}.{_k}"] = Figure(
            "h200-reference-tp1",
            half_widths(FA3, _d, _est),
            "{:.1f}-{:.1f}" if (_e, _k) == ("plain", "32k") else "{:.2f}-{:.2f}",
        )
FIGURES["est.mixed.32k"] = Figure(
    "h200-reference-tp1", mixed_ratio("widened", estimate.CLIENT, "stock", estimate.CORRECTED, K32), "{:.3f}"
)
FIGURES["est.same.32k"] = Figure("h200-reference-tp1", ratio("widened", K32), "{:.3f}")


def _pooled_of(arm: str) -> Callable[[RunFolder], list[dict[str, Any]]]:
    return lambda r: [r.comparison(arm, d) for d in (K1, K8, K32)]


def _rereported(r: RunFolder) -> Sequence[Any]:
    cs = _pooled_of("widened")(r)
    words = [c["decision"] for c in cs]
    head = (
        f"**{words[0]}** at every depth"
        if len(set(words)) == 1
        else " / ".join(f"**{w}**" for w in words) + " at 1K / 8K / 32K"
    )
    return [head, *(c["ci_half_width_pct"] for c in cs)]


FIGURES["ref.widened.rereported"] = Figure("h200-reference-tp1", _rereported, "{}, +-{:.2f} / {:.2f} / {:.2f} %")
FIGURES["triton.rereported"] = Figure(
    "h200-triton-tp1",
    lambda r: [c["ci_half_width_pct"] for c in _pooled_of("triton-attn")(r)],
    "+-{:.2f} / {:.2f} / {:.2f} %",
)
FIGURES["prec.pilot.widest"] = Figure(
    "h200-precision-tp1", lambda r: [r.summary["run"]["replication"]["pilot_widest_ci_half_width_pct"]], "+-{:.2f} %"
)
FIGURES["prec.predicted"] = Figure(
    "h200-precision-tp1", lambda r: [r.summary["run"]["replication"]["allocation"]["predicted_gpu_minutes"]], "{:.1f}"
)
FIGURES["prec.wall"] = Figure("h200-precision-tp1", lambda r: [r.summary["run"]["gpu_time"]["wall_minutes"]], "{:.1f}")
FIGURES["prec.split"] = Figure(
    "h200-precision-tp1",
    lambda r: [r.summary["run"]["gpu_time"][k] for k in ("starts_minutes", "warmup_minutes", "measure_minutes")],
    "starts {:.1f} min, warm-ups {:.1f}, timed rounds {:.1f}",
)


def _bandwidth(r: RunFolder) -> Sequence[float]:
    bw = r.manifest["gpu_bandwidth"]["best_gbps"]
    return [bw, 100 * bw / r.summary["roofline"]["bandwidth_gbps"]]


FIGURES["triton.bw"] = Figure("h200-triton-tp1", _bandwidth, "{:.0f} GB/s, {:.0f} %")
FIGURES["fork.bw"] = Figure("h200-fork-tp1", lambda r: [r.manifest["gpu_bandwidth"]["best_gbps"]], "{:.0f} GB/s")


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


FIGURES["triton.floor.measured"] = Figure(
    "h200-triton-tp1", floors("stock", "measured_over_measured_floor"), "{} / {} / {}"
)
FIGURES["triton.floor.datasheet"] = Figure("h200-triton-tp1", floors("stock", "measured_over_floor"), "{} / {} / {}")
FIGURES["ref.floor"] = Figure(
    "h200-reference-tp1", floors("stock", "measured_over_floor"), "{} at 1K, {} at 8K, {} at 32K"
)
FIGURES["triton.starts"] = Figure("h200-triton-tp1", starts, "{}, {}")
FIGURES["prec.predicted.hw"] = Figure(
    "h200-precision-tp1",
    lambda r: list(r.summary["run"]["replication"]["allocation"]["predicted_half_width_pct"].values()),
    "+-{:.2f} / {:.2f} / {:.2f} %",
)
FIGURES["prec.cold"] = Figure(
    "h200-precision-tp1", lambda r: [s["first_s"] for s in r.summary["startups"]], "{:.0f} / {:.0f} s"
)
FIGURES["prec.sd_server"] = Figure(
    "h200-precision-tp1", lambda r: [100 * r.summary["variance_model"]["sd_server"]], "{:.3f} %"
)
FIGURES["prec.bw"] = Figure("h200-precision-tp1", lambda r: [r.manifest["gpu_bandwidth"]["best_gbps"]], "{:.0f} GB/s")
FIGURES["load.bw"] = Figure(L1, lambda r: [r.manifest["gpu_bandwidth"]["best_gbps"]], "{:.0f} GB/s")
for _d, _k in ((K1, "1k"), (K8, "8k")):
    FIGURES[f"fork.{_k}.cells"] = Figure(
        "h200-fork-tp1", cells_by_pass("stock-fork", _d, "client_estimate_ms"), "{:.2f}, {:.2f}"
    )
FIGURES["fork.starts"] = Figure(
    "h200-fork-tp1",
    lambda r: [r.summary["startups"][0]["first_s"], r.summary["startups"][0]["later_median_s"]],
    "{:.1f} s cold, {:.1f} s warm",
)


def _route_moved(r: RunFolder) -> Sequence[float]:
    """FA3's primed c = 1 step (h200-load-tp1 at 1K/8K, h200-load-32k-tp1 at 32K) against the
    batch-1 cells of h200-reference-tp1 (prefix caching off), in % per depth."""
    ref = RunFolder(r.path.parent / "h200-reference-tp1")
    pts = ((r, K1), (r, K8), (RunFolder(r.path.parent / L32), K32))
    return [100 * (run.load("stock", d)["step_ms"] / arm_geomean("stock", d)(ref)[0] - 1) for run, d in pts]


FIGURES["route.fa3.moved"] = Figure(L1, _route_moved, "{:+.1f} / {:+.1f} / {:+.1f} %")
FIGURES["load8k.fa3.agree"] = Figure(
    L8,
    lambda r: [
        v
        for c in (4, 16, 32)
        for v in sorted((r.load("stock", K8, c)["step_ms"], cell_mean("stock", K8, c, "server_estimate_ms")(r)[0]))
    ],
    "{:.1f}-{:.1f}, {:.1f}-{:.1f}, {:.1f}-{:.1f} ms",
)
FIGURES["load32k.widened.c1.mde"] = Figure(L32, mde("widened", K32, 1), "{:.1f} %")
FIGURES["load32k.widened.c4.mde"] = Figure(L32, mde("widened", K32, 4), "{:.1f} %")
FIGURES["load.stalled.max.s"] = Figure(L1, lambda r: [stalled_ms(r)[1] / 1e3], "{:.1f} s")
FIGURES["demo.mde"] = Figure(
    "cpu-demo", lambda r: sorted(r.comparison("widened", d)["mde_pct"] for d in (256, 1024)), "{:.1f} and {:.1f} %"
)
FIGURES["load.mde"] = Figure(
    L1,
    lambda r: [
        min(c["mde_pct"] for c in r.summary["comparisons"] if c["scope"] == "pooled" and c["mde_pct"] is not None),
        max(c["mde_pct"] for c in r.summary["comparisons"] if c["scope"] == "pooled" and c["mde_pct"] is not None),
    ],
    "MDE {:.1f}-{:.1f} %",
)
FIGURES["load.rocm.8k.c1.ms1"] = Figure(L1, step("rocm-attn", K8, 1), "{:.1f}")
FIGURES["load8k.rocm.16to32"] = Figure(
    L8, lambda r: [step("rocm-attn", K8, c)(r)[0] for c in (16, 32)], "{:.0f} to {:.0f}"
)
FIGURES["load8k.fa3.16to32"] = Figure(L8, lambda r: [step("stock", K8, c)(r)[0] for c in (16, 32)], "{:.1f} to {:.1f}")
FIGURES["widened.32k.batch1runs"] = Figure(
    "h200-reference-tp1",
    _ratio_span_all(
        ("h200-reference-tp1", "h200-precision-tp1", "h200-neighbour-tp1", "h200-vllm023-tp1"), "widened", K32
    ),
    "{:.3f}-{:.3f}",
)
FIGURES["fa3.32k.c1.batch1runs"] = Figure(
    "h200-reference-tp1",
    _cell_span_all(("h200-reference-tp1", "h200-triton-tp1", "h200-precision-tp1"), "stock", K32),
    "{:.2f}-{:.2f}",
)
# Fresh prompts at 8K x 16 read 15.05 ms/step in a hand-run probe on the H200 (route_check, not a
# committed run); the figure is its excess over the committed, stall-checked primed step.
FRESH_8K_C16_MS = 15.05
FIGURES["fresh.vs.primed"] = Figure(
    L8, lambda r: [100 * (FRESH_8K_C16_MS / r.load("stock", K8, 16)["step_ms"] - 1)], "{:+.1f} %"
)


# -- reading and rewriting the pages -----------------------------------------------------------------
def pages(root: Path = ROOT) -> list[Path]:
    return [p for p in (root / q for q in PAGES) if p.is_file()] + sorted((root / "docs").rglob("*.md"))


@dataclass(frozen=True)
class Quote:
    page: Path
    line: int
    id: str
    text: str


FENCE = re.compile(r"^ *(```|~~~).*?^ *\1", re.S | re.M)


def _marks(text: str) -> list[re.Match[str]]:
    """The markers outside fenced code blocks (an example of a marker is not a figure)."""
    fenced = [m.span() for m in FENCE.finditer(text)]
    return [m for m in MARK.finditer(text) if not any(a <= m.start() < b for a, b in fenced)]


def quotes(paths: Iterable[Path]) -> list[Quote]:
    out = []
    for p in paths:
        text = p.read_text()
        for m in _marks(text):
            out.append(Quote(p, text.count("\n", 0, m.start()) + 1, m["id"], m["text"]))
    return out


# A run's pooled comparison needs no entry of its own: ratio/RUN/ARM/DEPTH[/cC] is its ratio and
# interval, mde/RUN/ARM/DEPTH[/cC] its MDE (the verdict tables' figures, quoted in prose).
FAMILY = re.compile(r"(?P<kind>ratio|mde)/(?P<run>[\w.\-]+)/(?P<arm>[\w.\-]+)/(?P<depth>\d+)(?:/c(?P<c>\d+))?")


def figure(fid: str) -> Figure | None:
    """The registered figure of an id, or the one a comparison id names; None where neither."""
    if fid in FIGURES:
        return FIGURES[fid]
    if not (m := FAMILY.fullmatch(fid)):
        return None
    arm, depth, c = m["arm"], int(m["depth"]), int(m["c"] or 1)
    if m["kind"] == "ratio":
        return Figure(m["run"], ratio(arm, depth, c), RC)
    return Figure(m["run"], mde(arm, depth, c), "{:.1f}")


def _rendered(ids: Iterable[str], results: Path) -> dict[str, str | Exception]:
    out: dict[str, str | Exception] = {}
    for i in ids:
        if (f := figure(i)) is not None:
            try:
                out[i] = f.render(results)
            except (LookupError, OSError, ValueError, KeyError, TypeError) as e:
                out[i] = e
    return out


def check(root: Path = ROOT, results: Path | None = None, figures: Iterable[str] | None = None) -> list[str]:
    """One line per stale, unknown, unreadable or unquoted figure; empty when the pages hold."""
    qs = quotes(pages(root))
    now = _rendered({q.id for q in qs}, results or root / "results")
    problems = []
    for q in qs:
        where = f"{q.page.relative_to(root)}:{q.line}: fig:{q.id}"
        got = now.get(q.id)
        if (f := figure(q.id)) is None:
            problems.append(f"{where} is not registered in e2e/report/doc_figures.py")
        elif isinstance(got, Exception):
            problems.append(f"{where}: cannot be recomputed from results/{f.run}: {got}")
        elif got != q.text:
            problems.append(f"{where} reads {q.text!r}; its run folder gives {got!r}")
    quoted = {q.id for q in qs}
    problems += [
        f"fig:{i} is registered and quoted nowhere"
        for i in sorted(set(FIGURES if figures is None else figures) - quoted)
    ]
    return problems


def _fixed(text: str, now: dict[str, str | Exception], day: str, changed: list[str], page: str) -> str:
    keep = {m.start() for m in _marks(text)}

    def fix(m: re.Match[str]) -> str:
        got = now.get(m["id"])
        if m.start() not in keep or not isinstance(got, str) or got == m["text"]:
            return m[0]
        changed.append(f"{page}: fig:{m['id']} {m['text']!r} -> {got!r}")
        note = "" if m["text"] == NEW else f" (corrected {day}: was {m['text']})"
        return f"<!-- fig:{m['id']} -->{got}<!-- /fig -->{note}"

    return MARK.sub(fix, text)


def update(root: Path = ROOT, results: Path | None = None, today: str | None = None) -> list[str]:
    """Rewrite every stale marked figure with its recomputed text, the correction dated after it."""
    day = today or dt.datetime.now(dt.UTC).date().isoformat()
    changed: list[str] = []
    for p in pages(root):
        text = p.read_text()
        now = _rendered({m["id"] for m in _marks(text)}, results or root / "results")
        new = _fixed(text, now, day, changed, str(p.relative_to(root)))
        if new != text:
            p.write_text(new)
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m e2e.report.doc_figures", description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["check", "update"])
    a = ap.parse_args(argv)
    lines = check() if a.command == "check" else update()
    for line in lines:
        print(line)
    if a.command == "check":
        print(f"doc figures: {len(lines)} problem(s)" if lines else "doc figures ok")
        return 1 if lines else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
