"""From rows.jsonl to the summary table, summary.json/summary.md and the two figures.

Everything here is recomputed from the rows (and the manifest's statements); nothing measured is
stored only in a summary. `python -m kernels_check --report RUN_DIR` reruns it without a GPU.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from e2e.errors import UserError
from e2e.report.tables import num
from e2e.rundir.formats import VERSIONS
from e2e.rundir.store import KERNEL_ROWS as ROWS
from e2e.rundir.store import read_jsonl, write_json_atomic

Row = dict[str, Any]  # a row of rows.jsonl, the manifest, or an entry of a summary table
SCHEMA_VERSION = VERSIONS["kernels"]


def read_rows(run_dir: Path) -> tuple[Row, list[Row]]:
    run_dir = Path(run_dir)
    if not (run_dir / ROWS).is_file():
        raise UserError(f"{run_dir}: no {ROWS} (not a kernels_check run folder)")
    rows = read_jsonl(run_dir / ROWS)
    for r in rows[:1]:
        if r.get("schema_version") != SCHEMA_VERSION:
            raise UserError(
                f"{run_dir / ROWS}: schema_version {r.get('schema_version')} but this report reads {SCHEMA_VERSION}"
            )
    manifest: Row = {}
    if (run_dir / "manifest.json").is_file():
        manifest = json.loads((run_dir / "manifest.json").read_text())
    return manifest, rows


def comparator(manifest: Row, rows: list[Row]) -> str | None:
    """The non-Triton path: the ROCm custom kernel where it ran, else FA3."""
    seen = {r.get("path") for r in rows if r.get("kind") == "cell"}
    for p in ("rocm_custom", "fa3"):
        if p in seen:
            return p
    named: str | None = manifest.get("comparator")
    return named


def _shape_key(r: Row) -> tuple[bool, int, int]:
    s = r["shape"]
    return (s["kv_heads"] != 8, s["ratio"], s["q_heads"])  # ratio shapes first, then others


def cell_table(rows: list[Row], other: str | None) -> list[Row]:
    """One entry per (dtype, shape, context): each path's times and errors, and the ratio."""
    by: dict[tuple[str, str, int], dict[str, Row]] = defaultdict(dict)
    meta: dict[tuple[str, str, int], Row] = {}
    for r in rows:
        if r.get("kind") != "cell":
            continue
        key = (r["dtype"], r["shape"]["name"], r["context"])
        by[key][r["path"]] = r
        meta[key] = r
    out = []
    for key in sorted(by, key=lambda k: (k[0], _shape_key(meta[k]), k[2])):
        paths = by[key]
        r0 = meta[key]
        e: dict[str, Any] = {
            "dtype": key[0],
            "shape": key[1],
            "ratio": r0["shape"]["ratio"],
            "context": key[2],
            "batch": r0.get("batch"),
        }
        for p, r in paths.items():
            e[f"{p}_status"] = r.get("status")
            e[f"{p}_ms"] = (r.get("time_cold") or {}).get("median_ms")
            e[f"{p}_graph_ms"] = (r.get("time_graph") or {}).get("median_ms")
            sc = r.get("score") or {}
            e[f"{p}_err"] = sc.get("rel_linf")
            e[f"{p}_score"] = sc.get("status")
            e[f"{p}_routed"] = r.get("routed_as_expected")
            if r.get("error"):
                e[f"{p}_error"] = r["error"]
        t, o = e.get("triton_ms"), e.get(f"{other}_ms") if other else None
        e["ratio_triton_over_other"] = (t / o) if (t and o) else None
        tg, og = e.get("triton_graph_ms"), e.get(f"{other}_graph_ms") if other else None
        e["ratio_graph"] = (tg / og) if (tg and og) else None
        out.append(e)
    return out


def fault_table(rows: list[Row]) -> list[Row]:
    """One entry per (dtype, shape, length, value, mode): each path's outcome."""
    by: dict[tuple[str, str, int, str, str], Row] = {}
    for r in rows:
        if r.get("kind") != "fault" or "mode" not in r:
            continue
        key = (r["dtype"], r["shape"]["name"], r["length"], r.get("value") or "-", r["mode"])
        e = by.setdefault(
            key,
            {
                "dtype": key[0],
                "shape": key[1],
                "length": key[2],
                "tail_slots": r.get("tail_slots"),
                "value": key[3],
                "mode": key[4],
            },
        )
        e[r["path"]] = outcome(r)
    return [by[k] for k in sorted(by)]


def outcome(r: Row) -> str:
    if r.get("status") != "ok":
        return "failed"
    sc = r.get("score") or {}
    st = sc.get("status")
    if st == "ok":
        return "clean"
    if st == "nonfinite":
        return f"NaN/inf x{sc.get('n_nan', 0) + sc.get('n_inf', 0)}"
    if st == "unwritten":
        return f"unwritten x{sc.get('n_unwritten')}"
    return f"err {sc.get('rel_linf', 0):.1e}"


def control_summary(rows: list[Row]) -> dict[str, dict[str, int]]:
    """Per path: how many written-slot controls ran, and how many the instrument flagged."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: {"ran": 0, "flagged": 0, "failed": 0})
    for r in rows:
        if r.get("kind") != "fault_control" or "path" not in r:
            continue
        c = out[r["path"]]
        if r.get("status") != "ok":
            c["failed"] += 1
            continue
        c["ran"] += 1
        c["flagged"] += bool(r.get("faulted"))
    return dict(out)


def routing_summary(rows: list[Row]) -> list[Row]:
    return [
        {
            "shape": r["shape"]["name"],
            "gate_forced": r["gate_forced"],
            "counts": r["counts"],
            "steered": r["steered"],
            "raised": r.get("raised"),
        }
        for r in rows
        if r.get("kind") == "routing"
    ]


def statement(manifest: Row, other: str | None) -> str:
    rc = manifest.get("rocm_custom") or {}
    if rc.get("available"):
        return "ROCm custom kernel available: compared it with the Triton fallback through the dispatch."
    if other == "fa3":
        return (
            "The ROCm custom paged-attention kernel was NOT available on this machine "
            f"({manifest.get('gpu', {}).get('name', 'this GPU')}): the comparison is vLLM's Triton "
            "kernel_paged_attention_2d (gate forced off) against vLLM's FlashAttention 3 on the same K/V."
        )
    return "The ROCm custom paged-attention kernel was NOT available on this machine; no comparator ran."


def _routing_lines(rows: list[Row]) -> list[str]:
    routing = routing_summary(rows)
    if not routing:
        return []
    lines = [
        "",
        "## Routing (gate forced through the patch mechanism; ops counted)",
        "",
        "| shape | gate | triton_2d | rocm_custom | prefill | steered | raised |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in routing:
        c = r["counts"]
        lines.append(
            f"| {r['shape']} | {'on' if r['gate_forced'] else 'off'} | {c.get('triton_2d')} | "
            f"{c.get('rocm_custom')} | {c.get('prefill')} | {r['steered']} | {(r['raised'] or '')[:70]} |"
        )
    return lines


def _fault_lines(rows: list[Row]) -> list[str]:
    ft = fault_table(rows)
    if not ft:
        return []
    fpaths = sorted({k for e in ft for k in e} - {"dtype", "shape", "length", "tail_slots", "value", "mode"})
    lines = [
        "",
        "## Faults in the unwritten tail of the final KV block",
        "",
        "| dtype | shape | length | tail slots | value | mode | " + " | ".join(fpaths) + " |",
        "|" + "---|" * (6 + len(fpaths)),
    ]
    for e in ft:
        lines.append(
            f"| {e['dtype']} | {e['shape']} | {e['length']} | {e['tail_slots']} | {e['value']} | "
            f"{e['mode']} | " + " | ".join(e.get(p, "-") for p in fpaths) + " |"
        )
    for p in fpaths:
        tails = [e[p] for e in ft if e["mode"] != "none" and p in e]
        bad = [x for x in tails if x != "clean"]
        lines.append(f"\n{p}: {len(bad)} of {len(tails)} tail-fault rows changed the output")
    return lines


def _cell_lines(cells: list[Row], o: str) -> list[str]:
    """The per-cell table, printed last, and the ranges of its ratio and errors; o: the comparator."""
    lines = [
        "",
        "## Decode kernels, per cell (printed last)",
        "",
        f"| dtype | shape | ratio | context | triton ms | {o} ms | triton/{o} | graph ratio | "
        f"triton err | {o} err | notes |",
        "|" + "---|" * 11,
    ]
    for e in cells:
        notes = [f"{p}: {e[p + '_status']}" for p in ("triton", o) if e.get(f"{p}_status") not in (None, "ok")]
        notes += [f"{p} score {e[p + '_score']}" for p in ("triton", o) if e.get(f"{p}_score") not in (None, "ok")]
        lines.append(
            f"| {e['dtype']} | {e['shape']} | {e['ratio']} | {e['context']} | "
            f"{num(e.get('triton_ms'), '{:.4f}')} | {num(e.get(o + '_ms'), '{:.4f}')} | "
            f"{num(e.get('ratio_triton_over_other'), '{:.2f}')} | {num(e.get('ratio_graph'), '{:.2f}')} | "
            f"{num(e.get('triton_err'), '{:.2e}')} | {num(e.get(o + '_err'), '{:.2e}')} | {'; '.join(notes)} |"
        )
    ratios = [e["ratio_triton_over_other"] for e in cells if e.get("ratio_triton_over_other")]
    if ratios:
        lines += [
            "",
            f"triton/{o} time ratio (L2-cold, median of each cell): {min(ratios):.2f} to "
            f"{max(ratios):.2f} over {len(ratios)} cells",
        ]
    for p in ("triton", o):
        errs = [e[f"{p}_err"] for e in cells if e.get(f"{p}_err") is not None]
        if errs:
            lines.append(f"{p} relative L-inf error: {min(errs):.2e} to {max(errs):.2e} over {len(errs)} cells")
    return lines


def markdown(manifest: Row, rows: list[Row]) -> str:
    other = comparator(manifest, rows)
    lines = [f"# kernels_check {manifest.get('run_id', '')}", "", statement(manifest, other), ""]
    lines += [
        f"vLLM {manifest.get('versions', {}).get('vllm')} · torch "
        f"{manifest.get('versions', {}).get('torch')} · triton {manifest.get('versions', {}).get('triton')}"
        f" · {manifest.get('gpu', {}).get('name')} · git {(manifest.get('git') or {}).get('commit')}",
        "",
    ]
    lines += _routing_lines(rows) + _fault_lines(rows)
    cs = control_summary(rows)
    if cs:
        lines += [
            "",
            "Instrument check (faults written into slots the kernel must read): "
            + "; ".join(
                f"{p} flagged {c['flagged']}/{c['ran']}" + (f" ({c['failed']} failed)" if c["failed"] else "")
                for p, c in sorted(cs.items())
            ),
        ]
    failed = [r for r in rows if r.get("status") == "failed"]
    if failed:
        lines += ["", f"{len(failed)} rows failed; first: {failed[0].get('error')}"]
    lines += _cell_lines(cell_table(rows, other), other or "other")
    return "\n".join(lines) + "\n"


def figures(manifest: Row, rows: list[Row], run_dir: Path) -> list[str]:
    """fig_time_ratio.png (triton/other per shape and depth) and fig_error_vs_depth.png."""
    from e2e.report import tables
    from e2e.report.figures import depth_axis

    other = comparator(manifest, rows)
    cells = cell_table(rows, other)
    made = []
    series: dict[tuple[str, str, int], list[tuple[int, float]]] = defaultdict(list)
    for e in cells:
        if e.get("ratio_triton_over_other"):
            series[(e["dtype"], e["shape"], e["ratio"])].append((e["context"], e["ratio_triton_over_other"]))
    if series:  # no plot without data (a run without timing, or without a comparator)
        fig, ax = tables.new_figure(7, 4.2)
        for (dt, sh, ra), pts in sorted(series.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{sh} (ratio {ra}) {dt}")
        ax.axhline(1.0, color="grey", lw=0.8, ls="--", label=f"1: as fast as {other}")
        depth_axis(ax, sorted({c for pts in series.values() for c, _ in pts}), "context (tokens)")
        ax.set_ylabel(f"Triton time / {other} time")
        ax.set_title(
            f"Decode kernel time ratio, L2-cold medians ({manifest.get('gpu', {}).get('name', '')}); "
            "a line per shape (q/kv heads)",
            fontsize=9,
        )
        ax.legend(fontsize=7)
        tables.save_figure(fig, run_dir / "fig_time_ratio.png")
        made.append("fig_time_ratio.png")

    fig, ax = tables.new_figure(7, 4.2)
    for p in ("triton", other):
        by_ctx: dict[int, list[float]] = defaultdict(list)
        for e in cells:
            if e.get(f"{p}_err") is not None and e.get(f"{p}_score") == "ok":
                by_ctx[e["context"]].append(e[f"{p}_err"])
        if not by_ctx:
            continue
        xs = sorted(by_ctx)
        ax.plot(xs, [statistics.median(by_ctx[x]) for x in xs], marker="o", label=f"{p} (median over shapes)")
        ax.fill_between(xs, [min(by_ctx[x]) for x in xs], [max(by_ctx[x]) for x in xs], alpha=0.2)
    if not ax.lines:  # no scored cell: no plot
        import matplotlib.pyplot as plt

        plt.close(fig)
        return made
    depth_axis(ax, sorted({int(x) for line in ax.lines for x in line.get_xdata()}), "context (tokens)")
    ax.set_yscale("log")
    ax.set_ylabel("relative L-inf error vs fp32 reference")
    ax.set_title("Error against depth: median over the shapes, band from the smallest to the largest", fontsize=9)
    ax.legend(fontsize=7)
    tables.save_figure(fig, run_dir / "fig_error_vs_depth.png")
    made.append("fig_error_vs_depth.png")
    return made


def write_report(run_dir: Path) -> str:
    """Recompute summary.md, summary.json and the figures from the rows; returns the markdown."""
    run_dir = Path(run_dir)
    manifest, rows = read_rows(run_dir)
    other = comparator(manifest, rows)
    md = markdown(manifest, rows)
    (run_dir / "summary.md").write_text(md)
    try:
        made = figures(manifest, rows, run_dir)
        fig_error = None
    except Exception as exc:  # a plotting problem must not lose the table
        made, fig_error = [], f"{type(exc).__name__}: {exc}"
    write_json_atomic(
        run_dir / "summary.json",
        {
            "schema_version": SCHEMA_VERSION,
            "statement": statement(manifest, other),
            "comparator": other,
            "cells": cell_table(rows, other),
            "faults": fault_table(rows),
            "controls": control_summary(rows),
            "routing": routing_summary(rows),
            "figures": made,
            "figures_error": fig_error,
            "n_rows": len(rows),
            "n_failed": sum(r.get("status") == "failed" for r in rows),
        },
    )
    return md
