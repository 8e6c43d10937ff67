"""Regression tracking across runs: `compare RUN_A RUN_B` and `history DIR`.

compare: for every arm present in both runs and every depth, run B's cells against run A's cells
with the same decision rule as within a run (stats.pooled_ratio: each cell is one server, one
replicate). Exit status 1 when any arm/depth is "slower" in B (significant and beyond min effect),
else 0. Runs are comparable only when the CHECKED metadata match (pyperf's rule): a mismatch is
refused unless --force, and then every mismatch is printed.

history: every run folder under DIR, ordered by vLLM version or by start date; per arm and depth
the pooled estimate with its interval, and each run decided against the run before it.
"""
from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.table import Table

from e2e import stats, tables
from e2e.analysis import RunAnalysis, gpu_name, vllm_version
from e2e.errors import UserError
from e2e.progress import make_console
from e2e.formats import VERSIONS
from e2e.store import write_json_atomic
from e2e.tables import num

# name -> how to read it from an analysed run. Samples from runs that differ in any of these are
# "not comparable", never pooled or compared.
CHECKED_METADATA: dict[str, Callable[[RunAnalysis], Any]] = {
    "model": lambda a: (a.manifest.get("model") or {}).get("path"),
    "twin_of": lambda a: (a.manifest.get("model") or {}).get("twin_of"),
    "tensor_parallel_size": lambda a: a.tp,
    "depths": lambda a: a.depths,
    "long_tokens": lambda a: a.n_long,
    "short_tokens": lambda a: a.n_short,
    "gpu": lambda a: gpu_name(a.manifest),
}


def metadata_mismatches(a: RunAnalysis, b: RunAnalysis) -> list[str]:
    out = []
    for name, get in CHECKED_METADATA.items():
        va, vb = get(a), get(b)
        if va != vb:
            out.append(f"{name}: {va!r} vs {vb!r}")
    return out


def _cells_of(a: RunAnalysis, arm: str, depth: int) -> list[stats.CellStats]:
    return [a.cells[(arm, depth, p)] for p in a.passes if (arm, depth, p) in a.cells]


def compare_runs(a: RunAnalysis, b: RunAnalysis, arms: list[str] | None = None) -> list[dict[str, Any]]:
    """Rows: arm, depth, run A and run B pooled estimates, the B/A comparison and its decision."""
    common = [x for x in a.arms if x in b.arms] if arms is None else arms
    for x in common:
        if x not in a.arms or x not in b.arms:
            raise UserError(f"--arm {x!r} is not in both runs (A: {a.arms}, B: {b.arms})")
    if not common:
        raise UserError(f"the runs share no arm (A: {a.arms}, B: {b.arms}): name one with --arm")
    alpha, min_eff = b.alpha, b.min_effect_pct
    rows = []
    for arm in common:
        for d in sorted(set(a.depths) & set(b.depths)):
            ca, cb = _cells_of(a, arm, d), _cells_of(b, arm, d)
            cmp = stats.pooled_ratio(ca, cb, alpha, min_eff)
            rows.append({"arm": arm, "depth": d, "a": stats.pooled_estimate(ca), "b": stats.pooled_estimate(cb),
                         **cmp.to_dict()})
    return rows




def compare_table(rows: list[dict[str, Any]], title: str) -> Table:
    t = Table(title=title)
    for c in ("arm", "depth", "A ms/tok", "B ms/tok", "B/A", "95 % CI", "p", "decision"):
        t.add_column(c)
    for r in rows:
        color = {"slower": "red", "faster": "green"}.get(r["decision"], "")
        t.add_row(r["arm"], str(r["depth"]), num(r["a"]["estimate_ms"]), num(r["b"]["estimate_ms"]),
                  num(r["ratio"], "{:.3f}"),
                  f"{num(r['ratio_ci_lo'], '{:.3f}')} to {num(r['ratio_ci_hi'], '{:.3f}')}",
                  num(r["p_value"], "{:.3g}"), f"[{color}]{r['decision']}[/{color}]" if color else r["decision"])
    return t


def add_compare_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_a", help="baseline run folder")
    p.add_argument("run_b", help="candidate run folder (a regression is B slower than A)")
    p.add_argument("--arm", action="append", help="arm(s) to compare (default: every arm in both runs)")
    p.add_argument("--force", action="store_true", help="compare although checked metadata differ")
    p.add_argument("--json", metavar="FILE", help="also write the comparison as JSON")


def compare_main(args: argparse.Namespace, console: Console | None = None) -> int:
    """0: no significant regression; 1: B is slower somewhere (significant and >= min effect)."""
    console = console or make_console()
    a, b = RunAnalysis(args.run_a), RunAnalysis(args.run_b)
    mism = metadata_mismatches(a, b)
    if mism and not args.force:
        raise UserError(f"runs are not comparable ({'; '.join(mism)}): use --force to compare anyway")
    for m in mism:
        console.print(f"[yellow]warning: metadata differ (forced): {m}[/yellow]")
    rows = compare_runs(a, b, args.arm)
    console.print(compare_table(rows, f"B = {b.root.name} (vLLM {vllm_version(b.manifest)}) vs "
                                      f"A = {a.root.name} (vLLM {vllm_version(a.manifest)})"))
    for r in rows:
        for w in r["warnings"]:
            console.print(f"warning: {r['arm']} at {r['depth']}: {w}")
    regressions = [r for r in rows if r["decision"] == stats.SLOWER]
    if args.json:
        write_json_atomic(Path(args.json), {"schema_version": VERSIONS["compare"], "kind": "e2e-compare",
                                            "run_a": str(a.root), "run_b": str(b.root),
                                            "metadata_mismatches": mism, "rows": rows,
                                            "regressions": len(regressions)})
    if regressions:
        console.print(f"[red]{len(regressions)} significant regression(s) beyond "
                      f"{b.min_effect_pct:g} %[/red]")
        return 1
    console.print("no significant regression")
    return 0


# -- history ------------------------------------------------------------------------------------
def _version_key(v: str | None) -> tuple:
    """Sort key for version strings: numeric release parts compare as numbers (0.9 < 0.26);
    unknown versions sort last. (No packaging dependency: the GPU machine has no index.)"""
    if not v:
        return (1, ())
    head = v.split(" / ")[0].split("+")[0]
    m = re.match(r"^v?(\d+(?:\.\d+)*)(.*)$", head)
    if not m:
        return (1, (head,))
    # a suffix (rc1, .dev3) sorts before the plain release of the same number
    return (0, tuple(int(x) for x in m.group(1).split(".")), m.group(2) == "", m.group(2))


def find_runs(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise UserError(f"history: {folder} is not a folder")
    runs = sorted(p for p in folder.iterdir() if (p / "manifest.json").is_file() and (p / "plan.json").is_file())
    if not runs:
        raise UserError(f"history: no run folders (with manifest.json) under {folder}")
    return runs


def history(folder: Path, order_by: str = "version") -> list[dict[str, Any]]:
    """One row per (run, arm, depth) in run order, each decided against the previous run of the
    series (same arm and depth) when the checked metadata allow it."""
    runs = [RunAnalysis(p) for p in find_runs(folder)]
    if order_by == "version":
        runs.sort(key=lambda r: (_version_key(vllm_version(r.manifest)), r.manifest.get("started") or ""))
    else:
        runs.sort(key=lambda r: r.manifest.get("started") or "")
    rows = []
    prev: dict[tuple[str, int], RunAnalysis] = {}
    for i, r in enumerate(runs):
        for arm in r.arms:
            for d in r.depths:
                cells = _cells_of(r, arm, d)
                row = {"order": i, "run": r.root.name, "vllm": vllm_version(r.manifest),
                       "started": r.manifest.get("started"), "arm": arm, "depth": d,
                       **stats.pooled_estimate(cells), "vs_previous": None, "ratio_to_previous": None}
                p = prev.get((arm, d))
                if p is not None:
                    mism = metadata_mismatches(p, r)
                    if mism:
                        row["vs_previous"] = "not comparable: " + "; ".join(mism)
                    else:
                        cmp = stats.pooled_ratio(_cells_of(p, arm, d), cells, r.alpha, r.min_effect_pct)
                        row["vs_previous"], row["ratio_to_previous"] = cmp.decision, cmp.ratio
                prev[(arm, d)] = r
                rows.append(row)
    return rows


def history_plot(rows: list[dict[str, Any]], path: Path) -> None:
    runs = sorted({(r["order"], r["run"], r["vllm"]) for r in rows})
    fig, ax = tables.new_figure(max(6, 1.2 * len(runs)), 4.5)
    for key in sorted({(r["arm"], r["depth"]) for r in rows}):
        pts = [r for r in rows if (r["arm"], r["depth"]) == key and r["estimate_ms"] is not None]
        if not pts:
            continue
        err = [[r["estimate_ms"] - (r["ci_lo_ms"] or r["estimate_ms"]) for r in pts],
               [(r["ci_hi_ms"] or r["estimate_ms"]) - r["estimate_ms"] for r in pts]]
        ax.errorbar([r["order"] for r in pts], [r["estimate_ms"] for r in pts], yerr=err, marker="o",
                    capsize=3, label=f"{key[0]} @ {key[1]}")
    ax.set_xticks([o for o, _, _ in runs], [f"{n}\nvLLM {v}" for _, n, v in runs], fontsize=7)
    ax.set_ylabel("decode ms per token (95 % CI)")
    ax.set_title("History")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)
    tables.save_figure(fig, path)


def add_history_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", help="a folder of run folders (e.g. results/)")
    p.add_argument("--order-by", choices=("version", "date"), default="version",
                   help="order runs by vLLM version (then date) or by start date (default: %(default)s)")
    p.add_argument("--out", help="where history.csv and history.png go (default: the folder)")


def history_main(args: argparse.Namespace, console: Console | None = None) -> int:
    console = console or make_console()
    folder = Path(args.folder)
    rows = history(folder, args.order_by)
    out = Path(args.out) if args.out else folder
    out.mkdir(parents=True, exist_ok=True)
    t = Table(title=f"history of {folder} (by {args.order_by})")
    for c in ("run", "vLLM", "started", "arm", "depth", "ms/tok", "95 % CI", "cells", "vs previous"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["run"], str(r["vllm"]), str(r["started"]), r["arm"], str(r["depth"]),
                  num(r["estimate_ms"]), f"{num(r['ci_lo_ms'])} to {num(r['ci_hi_ms'])}", str(r["n_cells"]),
                  str(r["vs_previous"] or "-"))
    console.print(t)
    cols = ["order", "run", "vllm", "started", "arm", "depth", "estimate_ms", "ci_lo_ms", "ci_hi_ms",
            "n_cells", "vs_previous", "ratio_to_previous"]
    tables.write_csv(out / "history.csv", rows, cols, VERSIONS["history"])
    history_plot(rows, out / "history.png")
    console.print(f"wrote {out / 'history.csv'} and {out / 'history.png'}")
    return 0
