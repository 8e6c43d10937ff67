"""`run --dry-run`: the plan as a table (or JSON) and what it should resolve, predicted from earlier
runs (e2e/analysis/prior.py)."""

from __future__ import annotations

import json

from e2e.design.config import Config, batch_warnings
from e2e.design.plan import Cell, plan_table_rows
from e2e.report.progress import make_console
from e2e.stats.point import Point


def print_plan(cfg: Config, cells: list[Cell], as_json: bool) -> int:
    if as_json:
        print(json.dumps([c.to_dict() for c in cells], indent=1))
        return 0
    from rich.table import Table

    t = Table(title=f"plan: {cfg.name} ({len(cells)} cells, server mode {cfg.server.mode})")
    for col in ("index", "pass", "arm", "point", "cell_id"):
        t.add_column(col)
    for r in plan_table_rows(cells):
        t.add_row(*r)
    console = make_console()
    console.print(t)
    if cfg.workload.route == "primed":
        cs = ", ".join(map(str, cfg.workload.concurrency))
        console.print(f"batch: c in {cs} requests decode together (primed route at every point: docs/concepts/load.md)")
        for w in batch_warnings(cfg):
            console.print(w, markup=False)
    from e2e.analysis.prior import predict_plan, this_gpu

    pred = predict_plan(cfg, cells, gpu=this_gpu())
    if pred.get("note"):
        console.print(f"prediction: {pred['note']}")
        return 0
    t = Table(title=f"what this plan should resolve (from {pred['source']})")
    for col in ("arm / ref", "point", "95 % CI +-%", "MDE %", "df"):
        t.add_column(col)
    ref = cfg.arms[0].name
    for c in pred["comparisons"]:
        mde = "-" if c["mde_pct"] is None else f"{c['mde_pct']:.2f}"
        t.add_row(f"{c['arm']} / {ref}", str(Point.of(c)), f"{c['ci_half_width_pct']:.2f}", mde, f"{c['df']:.1f}")
    console.print(t)
    return 0
