"""`grid RUN [RUN ...] --out DIR`: one load grid drawn from several runs.

A grid of depths x concurrencies x arms rarely fits one session's GPU time: issue 32's H200 grid took
three runs (1K and 8K; 8K again with a longer short request; 32K with a third arm). This puts their
verdicts in one table per c and one figure (the run report's grid figure, e2e/report/figures.py), so
how each arm's ratio moves with batch and depth is seen across all of them.

Nothing is pooled across runs: each point shows one run's comparison with that run's own interval. A
point several runs measured takes the LAST run named on the command line that has a ratio there (name
the runs oldest first: a re-timing then wins), and the table lists every run's value, the one drawn
marked. The drawn points are ONE family: their p-values (each run's own, before its correction) are
Holm-adjusted together and re-decided, and their MDEs taken at the joint family's strictest step
(alpha / m over every drawn tested point), so the grid controls the family-wise error of everything it
shows; each run's own verdict (Holm within that run) is listed beside it. The runs must share the
reference arm, alpha and the minimum effect (one margin on the figure); every other difference in what
they ran (vLLM, GPU, model, tokens, server flags) is listed in grid.md, never hidden, and on the figure a
line that joins points of runs with different server flags is dotted there, each flag set its marker.

Exit status: 0 written, 2 bad input. The command line is e2e/cli/commands/grid.py.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from rich.console import Console

from e2e.analysis.run_analysis import RunAnalysis
from e2e.design.point import Point
from e2e.errors import UserError
from e2e.report import figures, report_md
from e2e.report import summary as sm
from e2e.report.progress import say
from e2e.rundir.store import write_json_atomic
from e2e.safety.safe_io import write_atomic
from e2e.stats import outcomes, planning, verdicts

GRID_MD, GRID_JSON = "grid.md", "grid.json"
# What may differ between the runs of one grid, listed per run in grid.md (summary.json's run block).
SAME_EVERYWHERE = ("--host", "--port", "--served-model-name", "--generation-config")
LISTED = ("vllm", "gpu", "model", "tp", "long_tokens", "short_tokens", "rounds", "passes", "estimator")


def _summary(path: Path) -> dict[str, Any]:
    """The run's summary (recomputed from its rows, as `report` does) with its server flags added."""
    if not (path / "manifest.json").is_file():
        raise UserError(f"{path}: not a run folder (no manifest.json)")
    a = RunAnalysis(path)
    s: dict[str, Any] = report_md.as_json(sm.build(a))
    argv = ((a.manifest.get("arms") or {}).get(s["run"]["reference_arm"]) or {}).get("server_argv") or []
    tail = argv[argv.index("serve") + 2 :] if "serve" in argv else []
    # the reference arm's vLLM flags past the model path, less the harness's own address and name
    keep, i = [], 0
    while i < len(tail):
        if tail[i] in SAME_EVERYWHERE:
            i += 2
            continue
        keep.append(tail[i])
        i += 1
    s["server_flags"] = shlex.join(keep) if keep else "-"
    return s


def pick(summaries: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Every run's pooled comparison, each with its run's name and whether it is the one drawn: per
    (arm, point), the last run named that has a ratio there."""
    rows = []
    for name, s in summaries:
        for c in s["comparisons"]:
            if c["scope"] == "pooled":
                rows.append({**c, "run": name, "drawn": False})
    last: dict[tuple[str, Point], dict[str, Any]] = {}
    for r in rows:
        if r.get("ratio") is not None:
            last[(r["arm"], Point.of(r))] = r
    for r in last.values():
        r["drawn"] = True
    return rows


def joint_family(rows: list[dict[str, Any]], alpha: float) -> str:
    """The drawn rows as one Holm family (verdicts.decide_family's rule on the runs' unadjusted p's):
    each gets grid_decision and grid_mde_pct; a drawn row without a test, or a row at a point with none
    drawn, keeps its run's word; a row another run's supersedes gets None. Returns the line saying what was done."""
    tested = [r for r in rows if r["drawn"] and r.get("decision") is not None and r.get("p_value") is not None]
    equiv = [r for r in tested if r.get("p_equiv") is not None]
    p_adj = dict(zip(map(id, tested), verdicts.adjust([r["p_value"] for r in tested], "holm")))
    e_adj = dict(zip(map(id, equiv), verdicts.adjust([r["p_equiv"] for r in equiv], "holm")))
    step = verdicts.family_step(len(tested), alpha, "holm")
    drawn = {(r["arm"], Point.of(r)) for r in rows if r["drawn"]}
    for r in rows:  # a point no run has a ratio at keeps each run's word (not measured (KV cache), say)
        shown = r["drawn"] or (r["arm"], Point.of(r)) not in drawn
        r["grid_decision"], r["grid_mde_pct"] = (r.get("decision"), r.get("mde_pct")) if shown else (None, None)
    for r in tested:
        measured = verdicts.decide(r["ratio"], p_adj[id(r)], e_adj.get(id(r)), alpha, r["min_effect_pct"])
        # an arm inert in its run (its patch changed nothing there) stays inert, whatever the numbers say
        r["grid_decision"] = verdicts.INERT if r["decision"] == verdicts.INERT else measured
        se, df = r.get("se_log"), r.get("df")
        r["grid_mde_pct"] = planning.mde_pct(se, df, step, r["min_effect_pct"]) if se and df is not None else None
    return (
        f"Holm step-down over the {len(tested)} drawn points with a test, across the runs, at family-wise alpha "
        f"{alpha:g} (step alpha / {len(tested)} = {step:.2g}), separately for the difference and the equivalence tests"
    )


def _check(summaries: list[tuple[str, dict[str, Any]]]) -> None:
    first_name, first = summaries[0]
    for name, s in summaries[1:]:
        for key, what in (("reference_arm", "reference arm"), ("min_effect_pct", "minimum effect"), ("alpha", "alpha")):
            if s["run"][key] != first["run"][key]:
                raise UserError(
                    f"{name}: its {what} is {s['run'][key]!r}, {first_name}'s {first['run'][key]!r}: one grid "
                    "needs one (its margin and its ratios are against it)"
                )


def _cell(r: dict[str, Any]) -> str:
    if r.get("ratio") is None:
        return "-"
    lo, hi = r.get("ratio_ci_lo"), r.get("ratio_ci_hi")
    return f"{r['ratio']:.3f}" + (f" ({lo:.3f} to {hi:.3f})" if lo is not None and hi is not None else "")


def markdown(summaries: list[tuple[str, dict[str, Any]]], rows: list[dict[str, Any]], family: str) -> str:
    ref, margin = summaries[0][1]["run"]["reference_arm"], summaries[0][1]["run"]["min_effect_pct"]
    words = outcomes.rule_text(r.get(k) for r in rows for k in ("decision", "grid_decision"))
    out = [
        "# Load grid across runs",
        "",
        f"Each arm against `{ref}`, per design point, from the runs below (`run_e2e.py grid`). Each row is one run's "
        f"comparison with that run's own interval; **drawn** marks the one the figure shows (the last run named "
        f"with a ratio there). The drawn points are one family: **grid verdict** and **grid MDE %** are theirs "
        f"({family}); **run verdict** and **run MDE %** are each run's own (Holm within that run's grid only). "
        f"Minimum effect {margin:g} %. {words}",
        "",
        "| run | " + " | ".join(LISTED) + " | server flags |",
        "|---|" + "---|" * len(LISTED) + "---|",
    ]
    for name, s in summaries:
        cells = [str(s["run"].get(k) if s["run"].get(k) is not None else "-") for k in LISTED]
        out.append(f"| `{name}` | " + " | ".join(cells) + f" | `{s['server_flags']}` |")
    for c in sorted({Point.of(r).concurrency for r in rows}):
        out += [
            "",
            f"## c = {c}",
            "",
            "| arm / ref | depth | run | servers | ratio (95 % CI) | run MDE % | run verdict | grid MDE % "
            "| grid verdict | drawn |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        at_c = [r for r in rows if Point.of(r).concurrency == c]
        for r in sorted(at_c, key=lambda r: (r["arm"], r["depth"], r["run"])):
            out.append(
                f"| {r['arm']} / {r['reference']} | {figures.depth_label(r['depth'])} | `{r['run']}` | "
                f"{r['n_ref']} + {r['n_arm']} | {_cell(r)} | {_pct(r.get('mde_pct'))} | {r['decision'] or '-'} | "
                f"{_pct(r.get('grid_mde_pct'))} | {r.get('grid_decision') or '-'} | "
                f"{'**drawn**' if r['drawn'] else ''} |"
            )
    out += ["", f"![the grid]({figures.RATIO}) {figures.grid_caption(_figure_summary(summaries, rows))}", ""]
    return "\n".join(out)


def _pct(x: float | None) -> str:
    return f"{x:.1f}" if x is not None else "-"


def _figure_summary(summaries: list[tuple[str, dict[str, Any]]], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the run report's grid figure reads: the run block's margin and reference, the drawn rows."""
    run = summaries[0][1]["run"]
    flags = {name: s["server_flags"] for name, s in summaries}
    return {
        "run": {"min_effect_pct": run["min_effect_pct"], "reference_arm": run["reference_arm"]},
        # the joint word; each point with its run's server flags (the figure marks a line that joins different ones)
        "comparisons": [
            {**r, "decision": r.get("grid_decision"), "server_flags": flags[r["run"]]} for r in rows if r["drawn"]
        ],
    }


def read_grid(runs: list[Path]) -> tuple[list[tuple[str, dict[str, Any]]], list[dict[str, Any]]]:
    """(each run's name and summary, the grid's rows: pick), refused where the runs cannot make one grid."""
    names = [p.name for p in runs]
    if len(set(names)) != len(names):
        raise UserError(f"a run is named twice: {', '.join(names)}")
    summaries = [(p.name, _summary(p)) for p in runs]
    _check(summaries)
    rows = pick(summaries)
    if not any(r["drawn"] for r in rows):
        raise UserError("no run has a comparison with a ratio: nothing to draw")
    return summaries, rows


def write_grid(
    console: Console, out: Path, summaries: list[tuple[str, dict[str, Any]]], rows: list[dict[str, Any]]
) -> None:
    """ratio_vs_depth.png, grid.md and grid.json in out (a folder output_folder made), and a line that says so."""
    family = joint_family(rows, summaries[0][1]["run"]["alpha"])
    figures.ratio_grid(_figure_summary(summaries, rows), out / figures.RATIO)
    write_atomic(out / GRID_MD, markdown(summaries, rows, family))
    keep = ("arm", "reference", "depth", "ratio", "ratio_ci_lo", "ratio_ci_hi", "mde_pct", "decision")
    write_json_atomic(
        out / GRID_JSON,
        {
            "kind": "e2e-grid",
            "runs": [name for name, _ in summaries],
            "family": family,
            "rows": [
                {
                    **{k: r.get(k) for k in keep},
                    "concurrency": Point.of(r).concurrency,  # 1 at batch 1 (a run's row leaves it out)
                    "grid_mde_pct": r["grid_mde_pct"],
                    "grid_decision": r["grid_decision"],
                    "run": r["run"],
                    "drawn": r["drawn"],
                }
                for r in rows
            ],
        },
    )
    say(console, f"wrote {out / GRID_MD}, {GRID_JSON} and {figures.RATIO} ({sum(r['drawn'] for r in rows)} points)")
