"""`history DIR`: a series of runs (ordered by vLLM version, or by date): per arm and depth the
decode estimate with its interval, and the change points of the series (e2e/stats/changepoints.py: steps
confirmed by the same pooled comparison a run uses), with a table, a CSV and a plot.

Runs are grouped into series by the checked metadata of e2e/report/compare.py (a step between runs of
different models or GPUs is not a regression of vLLM); a run folder that cannot be read is skipped
with a warning. Exit status: 0 no "slower" step, 1 a "slower" step, 3 cannot decide (no series with
two runs), 2 bad input.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from rich.console import Console

from e2e import exits
from e2e.analysis.manifest_facts import vllm_version
from e2e.analysis.run_analysis import RunAnalysis
from e2e.errors import UserError
from e2e.report import figures, tables
from e2e.report import summary as sm
from e2e.report.compare import CHECKED_METADATA, unfinished
from e2e.report.progress import make_console
from e2e.report.tables import interval, num
from e2e.rundir.formats import VERSIONS
from e2e.rundir.store import write_json_atomic
from e2e.stats import outcomes, verdicts
from e2e.stats.changepoints import find_change_points

SERIES_KEYS = [k for k in CHECKED_METADATA if k != "depths"]  # a run may add or drop a depth


def _version_key(v: str | None) -> tuple[Any, ...]:
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


def find_runs(folder: Path, match: str | list[str] = "*") -> list[Path]:
    """Run folders (manifest.json and plan.json) directly under folder whose name matches one of
    the globs."""
    if not folder.is_dir():
        raise UserError(f"history: {folder} is not a folder")
    globs = [match] if isinstance(match, str) else match
    runs = sorted(
        {p for g in globs for p in folder.glob(g) if (p / "manifest.json").is_file() and (p / "plan.json").is_file()}
    )
    if not runs:
        raise UserError(
            f"history: no run folders (with manifest.json) named {' or '.join(map(repr, globs))} under {folder}"
        )
    return runs


def load_runs(folder: Path, order_by: str, match: str | list[str] = "*") -> tuple[list[RunAnalysis], list[str]]:
    """The readable runs in series order, and a warning for each run folder skipped."""
    runs, skipped = [], []
    for p in find_runs(folder, match):
        try:
            runs.append(RunAnalysis(p))
        except UserError as exc:
            skipped.append(f"skipped {p.name}: {exc}")
    if order_by == "version":
        runs.sort(key=lambda r: (_version_key(vllm_version(r.manifest)), r.manifest.get("started") or ""))
    else:
        runs.sort(key=lambda r: r.manifest.get("started") or "")
    return runs, skipped


def history(runs: list[RunAnalysis]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows, steps). Rows: one per (run, arm, depth) in series order with the pooled estimate.
    Steps: the change points of each series (same checked metadata), arm and depth."""
    rows, steps = [], []
    series: dict[tuple[str, ...], list[int]] = {}
    # each run's place in time (1 = first started), shown beside its version: a version order
    # is not the order the runs were measured in
    in_time = {id(r): n for n, r in enumerate(sorted(runs, key=lambda r: r.manifest.get("started") or ""), 1)}
    for i, r in enumerate(runs):
        key = tuple(repr(CHECKED_METADATA[k](r)) for k in SERIES_KEYS)
        series.setdefault(key, []).append(i)
        finished = unfinished(r) is None
        for arm in r.arms:
            for d in r.depths:
                rows.append(
                    {
                        "order": i,
                        "run": r.root.name,
                        "vllm": vllm_version(r.manifest),
                        "time_order": in_time[id(r)],
                        "started": r.manifest.get("started"),
                        "finished": finished,
                        "arm": arm,
                        "depth": d,
                        "series": list(series).index(key),
                        "estimator": r.estimator,
                        **verdicts.arm_estimate(r.fit, arm, d, r._cells_of(arm, d)),
                    }
                )
    todo = []
    for s, members in enumerate(series.values()):
        arms_depths = sorted({(row["arm"], row["depth"]) for row in rows if row["order"] in members})
        for arm, d in arms_depths:
            idx = [i for i in members if runs[i]._cells_of(arm, d)]
            if len(idx) >= 2:
                todo.append((s, arm, d, idx))
    # one family: every arm x depth series of the history (Bonferroni over them in changepoints)
    for s, arm, d, idx in todo:
        cps = find_change_points(
            [runs[i]._cells_of(arm, d) for i in idx],
            runs[idx[0]].alpha,
            runs[idx[0]].min_effect_pct,
            labels=[runs[i].root.name for i in idx],
            n_series=len(todo),
        )
        steps += [
            {
                "series": s,
                "arm": arm,
                "depth": d,
                "after_run": cp.runs_before[-1],
                "first_run": cp.runs_after[0],
                "n_series": len(todo),
                **cp.to_dict(),
            }
            for cp in cps
        ]
    return rows, steps


def add_history_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", help="a folder of run folders (e.g. results/)")
    p.add_argument(
        "--order-by",
        choices=("version", "date"),
        default="version",
        help="order runs by vLLM version (then date) or by start date (default: %(default)s)",
    )
    p.add_argument(
        "--match",
        action="append",
        metavar="GLOB",
        help="only run folders whose name matches (e.g. 'cpu-vllm-*'; repeat for several; default: all)",
    )
    p.add_argument("--out", help="where history.csv/json/png go (default: the folder)")


def history_main(args: argparse.Namespace, console: Console | None = None) -> int:
    console = console or make_console()
    folder = Path(args.folder)
    runs, skipped = load_runs(folder, args.order_by, args.match or "*")
    for w in skipped:
        console.print(f"[yellow]warning: {w}[/yellow]")
    if not runs:
        raise UserError(f"history: no readable run folder under {folder}")
    short = [w for w in map(unfinished, runs) if w]
    for w in short:  # its rows are in the series, for what they hold; the reader must know it stopped short
        console.print(f"[bold yellow]warning: RUN NOT FINISHED: {w}[/bold yellow]")
    rows, steps = history(runs)
    out = Path(args.out) if args.out else folder
    out.mkdir(parents=True, exist_ok=True)
    console.print(tables.render_console(sm.HISTORY, rows, f"history of {folder} (by {args.order_by})"))
    for s in steps:
        console.print(
            f"change point: {s['arm']} at {s['depth']} between {s['after_run']} and {s['first_run']}: "
            f"ratio {num(s['ratio'], '{:.3f}')} ({interval(s['ratio_ci_lo'], s['ratio_ci_hi'], '{:.3f}')}), "
            f"p adj {num(s['p_adjusted'], '{:.3g}')}: {s['decision']}"
        )
    tables.write_table_csv(out / "history.csv", sm.HISTORY, rows, VERSIONS["history"])
    write_json_atomic(
        out / "history.json",
        {
            "schema_version": VERSIONS["history"],
            "kind": "e2e-history",
            "order_by": args.order_by,
            "runs": rows,
            "change_points": steps,
            "skipped": skipped,
            "unfinished": short,
        },
    )
    fig = figures.history_figure(rows, steps, args.order_by, out / "history.png")
    if fig is None and (out / "history.png").is_file():
        (out / "history.png").unlink()  # an earlier history's figure: this one has nothing to draw
    console.print(
        f"wrote {out / 'history.csv'}, history.json"
        + (" and history.png" if fig else " (no figure: no run has an estimate)")
    )
    comparable = any(len({r["order"] for r in rows if r["series"] == s}) >= 2 for s in {r["series"] for r in rows})
    status = outcomes.status_of(s["decision"] for s in steps if outcomes.LATENCY[s["decision"]].regression)
    status = status or (exits.OK if comparable else exits.CANNOT_DECIDE)
    console.print(f"exit status {status}: {exits.MEANING[status]}")
    return status
