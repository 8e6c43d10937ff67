"""The summary model: summary.json, the one record every output of a run is rendered from.

build(analysis) turns a run's analysis (e2e/analysis/run_analysis.py) into the summary; report.md
(e2e/report/report_md.py), summary.csv and comparisons.csv (e2e/report/write.py), the figures (e2e/report/figures.py)
and the console at the end of a run (e2e/run/session.py) are functions of it alone, so a report can be
re-rendered from summary.json (tests/unit/report/test_summary_model.py does, and compares). Every table is
declared once, as columns (e2e/report/tables.py): a column names its header, how a row shows, the
fields it writes to the CSV and the views that show it. The run's tables, `compare`'s and `history`'s
are declared here; the gsm8k sign-off's in e2e/report/gsm8k_tables.py. A cells.jsonl field shown in
the report is one column with from_row=True in CELLS: build() copies it from the row into
summary.json, and every view that names it shows it.

Sections of summary.json: run (facts, code identity, exit status), cells, arms, comparisons,
variance_model, pass_agreement, executor and slots, roofline, startups and start_phases, routing
and routing_warnings, gpu_state (the GPU's state around the cells: None until e2e/report/report_gpu.py
fills it), gsm8k (the sign-off's own summary, whole), warnings.
"""

from __future__ import annotations

from typing import Any

from e2e.analysis.manifest_facts import gpu_name, vllm_version
from e2e.design.point import Point
from e2e.report import report_gpu
from e2e.report.gsm8k_tables import GSM8K_COMPARISONS as GSM8K_COMPARISONS  # the console's, at a run's end
from e2e.report.tables import BOTH, CONSOLE, MD, Col, Table, col, interval, num, text
from e2e.rundir import identity, routing
from e2e.rundir.formats import VERSIONS
from e2e.stats import estimate, outcomes

SCHEMA_VERSION = VERSIONS["summary"]


def _verdict_colour(r: dict[str, Any]) -> str | None:
    w = outcomes.latency(r.get("decision"))
    return w.colour if w else None


def _ratio_ci(r: dict[str, Any]) -> str:
    ci = interval(r.get("ratio_ci_lo"), r.get("ratio_ci_hi"), "{:.3f}")
    return ci + ("" if r.get("ci_kind") in (None, "between-server") else f" ({r['ci_kind']})")


def _flagged(r: dict[str, Any]) -> str:
    ns, cc = r.get("non_stationary_servers") or [], r.get("contaminated_cells") or []
    parts = ([f"non-stationary: {', '.join(x.split('#')[0] for x in ns)}"] if ns else []) + (
        [f"contaminated, counted: {', '.join(cc)}"] if cc else []
    )
    return "**" + "; ".join(parts) + "**" if parts else "-"


def _servers_needed(r: dict[str, Any]) -> str:
    if r.get("p_value") is None:
        return "-"
    n = r.get("servers_needed")
    return str(n) if n is not None else "> 64"


# -- the run's tables ------------------------------------------------------------------------------
def point_col(views: frozenset[str] = frozenset({"md"})) -> Col:
    """A row's design point as tables show it: the depth, and `(c=4)` above batch 1 (e2e/design/point.py)."""
    return Col("depth", lambda r: str(Point.of(r)), ("depth",), views)


CONCURRENCY = col("concurrency", None, None, optional=True)  # in the CSVs of runs above batch 1 only

CELLS = Table(
    "cells",
    (
        col("cell_id", "cell", None, BOTH),
        col("pass", None, None),
        col("arm", None, None),
        col("depth", None, None),
        CONCURRENCY,
        col("server", None, None),
        col("status", "status", None, BOTH),
        col("estimator", None, None),
        col("estimate_ms", "ms/token", views=BOTH),
        Col("95 % CI", lambda r: interval(r.get("ci_lo_ms"), r.get("ci_hi_ms")), ("ci_lo_ms", "ci_hi_ms"), BOTH),
        col("half_width_pct", "±%", "{:.1f}"),
        col("robust_se_pct", "robust se %"),
        col("cv_pct", "CV %", "{:.1f}"),
        col("n_rounds", "rounds", "{}"),
        col("n_valid_long", None),
        col("n_valid_short", None),
        col("n_invalid", None),
        col("client_estimate_ms", "client ms/tok"),
        Col(
            "client - est %",
            lambda r: (
                num(r.get("client_gap_pct"), "{:+.2f}")
                + (" **(disagrees)**" if r.get("client_agrees") is False else "")
            ),
            ("client_gap_pct", "client_agrees"),
        ),
        col("server_estimate_ms", "server ms/tok", views=BOTH),
        col("server_disagreement_pct", "est - server %", "{:+.1f}"),
        col("stopped_by", "stopped by", None),
        col("startup_s", "start s", "{:.1f}", CONSOLE),
        col("warmup_s", "warm s", "{:.1f}", CONSOLE, from_row=True),
        col("measure_s", "measure s", "{:.1f}", CONSOLE, from_row=True),
        col("client_overhead_ms_median", "overhead ms/req", "{:.3f}", CONSOLE, from_row=True),
        col("warnings", None),
    ),
)

# Comparisons: the pooled rows are the Verdicts table ("md"), the per-pass rows the "pass" view;
# comparisons.csv holds both.
PASS = frozenset({"pass"})
COMPARISONS = Table(
    "comparisons",
    (
        Col("arm / ref", lambda r: f"{r['arm']} / {r['reference']}", ("arm", "reference"), BOTH | PASS),
        point_col(BOTH | PASS),
        CONCURRENCY,
        col("scope", None, None),
        col("pass", "pass", "{}", PASS),
        Col("servers", lambda r: f"{r['n_arm']} + {r['n_ref']}", ("n_arm", "n_ref")),
        col("ratio", "ratio", "{:.3f}", BOTH | PASS),
        Col("95 % CI", _ratio_ci, ("ratio_ci_lo", "ratio_ci_hi", "ci_kind"), BOTH),
        Col(
            "95 % CI (within-server)",
            lambda r: interval(r.get("ratio_ci_lo"), r.get("ratio_ci_hi"), "{:.3f}"),
            (),
            PASS,
        ),
        Col(
            "diff ms/tok (CI)",
            lambda r: (
                f"{num(r.get('diff_ms'), '{:+.2f}')} ({num(r.get('diff_ci_lo_ms'), '{:+.2f}')}"
                f"..{num(r.get('diff_ci_hi_ms'), '{:+.2f}')})"
            ),
            ("diff_ms", "diff_ci_lo_ms", "diff_ci_hi_ms"),
        ),
        col("df", "df", "{:.1f}"),
        col("p_value", None),
        col("p_adjusted", "p (Holm)", "{:.3g}"),
        col("p_equiv", None),
        col("p_equiv_adjusted", "TOST p (Holm)", "{:.3g}"),
        col("mde_pct", "MDE %", "{:.1f}", BOTH),
        col("alpha_step", None),
        Col("servers for MDE <= {target} %", _servers_needed, ("servers_needed", "target_mde_pct")),
        # a non-stationary server (its drift is in the model's variance) or a cell counted beside another
        # process on its GPU (--gpu-exclusive warn): named in the row, never taken in silently
        Col("flagged", _flagged, ("non_stationary_servers", "contaminated_cells")),
        Col("verdict", lambda r: f"**{r['decision']}**", ("decision",), MD),
        Col("verdict", lambda r: text(r.get("decision")), (), CONSOLE, colour=_verdict_colour),
        col("decision_unadjusted", None),
        col("correction", None),
        col("warnings", None),
    ),
)

# Decode under load (e2e/analysis/load.py): a table per concurrency in report.md
LOAD = Table(
    "load",
    (
        col("arm", "arm", None),
        col("depth", "depth", "{}"),
        col("concurrency", None, None),
        col("step_ms", "ms / step"),
        Col(
            "95 % CI",
            lambda r: interval(r.get("step_ci_lo_ms"), r.get("step_ci_hi_ms")),
            ("step_ci_lo_ms", "step_ci_hi_ms"),
        ),
        col("tokens_per_s", "tokens/s (c / step)", "{:.0f}"),
        Col(
            "95 % CI ",
            lambda r: interval(r.get("tokens_per_s_ci_lo"), r.get("tokens_per_s_ci_hi"), "{:.0f}"),
            ("tokens_per_s_ci_lo", "tokens_per_s_ci_hi"),
        ),
        col("n_cells", "servers", "{}"),
        Col(
            "server prefill ms (median, 95 % CI)",
            lambda r: f"{num(r.get('prefill_ms_median'))} ({interval(r.get('prefill_ms_lo'), r.get('prefill_ms_hi'))})",
            ("prefill_ms_median", "prefill_ms_lo", "prefill_ms_hi"),
        ),
        Col(
            "server TTFT ms (median, 95 % CI)",
            lambda r: f"{num(r.get('ttft_ms_median'))} ({interval(r.get('ttft_ms_lo'), r.get('ttft_ms_hi'))})",
            ("ttft_ms_median", "ttft_ms_lo", "ttft_ms_hi"),
        ),
        col("n_rounds", "rounds", "{}"),
    ),
)

AGREEMENT = Table(
    "pass_agreement",
    (
        col("arm", "arm", None),
        point_col(),
        CONCURRENCY,
        col("max_rel_diff_pct", "largest difference %", "{:.1f}"),
        Col("beyond the intervals", lambda r: "**yes**" if r["flagged"] else "no", ("flagged",)),
    ),
)

SLOTS = Table(
    "slots",
    (
        col("slot", "slot", None),
        col("host", "host", None),
        col("n_cells", "cells", "{}"),
        Col("arms", lambda r: ", ".join(f"{k} {n}" for k, n in (r.get("arms") or {}).items()), ("arms",)),
        col("mean_dev_pct", "mean deviation from the arm and depth mean %", "{:+.2f}"),
    ),
)


def _over(per_arm: dict[str, list[float]]) -> str:
    return "; ".join(f"{arm} " + ", ".join(f"{x:.2f}x" for x in v) for arm, v in per_arm.items() if v) or "-"


def _bytes(e: dict[str, Any]) -> str:
    b = e["bytes_per_gpu"]
    return f"{b['total'] / 1e9:.2f} ({b['weights'] / 1e9:.2f} + {b['lm_head'] / 1e9:.2f} + {b['kv'] / 1e9:.2f})"


FLOOR = Table(
    "roofline",
    (
        col("depth", "depth", None),
        Col("GB/step/GPU (weights + lm_head + KV)", _bytes),
        col("floor_ms", "floor ms (datasheet)", "{:.3f}"),
        Col("measured / floor", lambda r: _over(r.get("measured_over_floor") or {})),
        col("floor_measured_ms", "floor ms (measured bw)", "{:.3f}"),
        Col("measured / that floor", lambda r: _over(r.get("measured_over_measured_floor") or {})),
    ),
)

STARTS = Table(
    "startups",
    (
        col("arm", "arm", None),
        col("starts", "starts", "{}"),
        col("first_s", "first s", "{:.1f}"),
        col("later_median_s", "later median s", "{:.1f}"),
        col("saved_per_start_s", "{saved}", "{:.1f}"),
    ),
)

PHASE_COLS = (
    ("startup_s", "start s"),
    ("before_log_s", "before vLLM's log"),
    ("api_to_engine_s", "API -> engine"),
    ("engine_to_worker_s", "engine -> worker"),
    ("weights_s", "weights"),
    ("compile_s", "torch.compile"),
    ("compile_cache", "cache"),
    ("graph_capture_s", "graph capture"),
    ("after_capture_s", "capture -> init end"),
    ("init_end_to_api_s", "init end -> API"),
)
PHASES = Table(
    "start_phases",
    (col("cell_id", "cell", None),)
    + tuple(col(k, h, None if k == "compile_cache" else "{:.1f}") for k, h in PHASE_COLS),
)

ROUTING = Table(
    "routing",
    (
        col("arm", "arm", None),
        Col("layer class / gate", lambda r: f"`{r['what']}`", ("what",)),
        col("path", "path", None),
        col("n_layers", "layers", "{}"),
        Col("processes", lambda r: ", ".join(r["processes"]), ("processes",)),
        Col("graphs", lambda r: ", ".join(r["graphs"]) or "-", ("graphs",)),
        Col("cells", lambda r: str(len(r["cells"])), ("cells",)),
    ),
)


# -- compare and history ---------------------------------------------------------------------------
COMPARE = Table(
    "compare",
    (
        col("arm", "arm", None, CONSOLE),
        point_col(CONSOLE),
        CONCURRENCY,
        Col("A ms/tok", lambda r: num(r["a"]["estimate_ms"]), views=CONSOLE),
        Col("B ms/tok", lambda r: num(r["b"]["estimate_ms"]), views=CONSOLE),
        col("ratio", "B/A", "{:.3f}", CONSOLE),
        Col("95 % CI", lambda r: interval(r.get("ratio_ci_lo"), r.get("ratio_ci_hi"), "{:.3f}"), views=CONSOLE),
        col("p_adjusted", "p (Holm)", "{:.3g}", CONSOLE),
        col("mde_pct", "MDE %", "{:.1f}", CONSOLE),
        Col("decision", lambda r: text(r.get("decision")), views=CONSOLE, colour=_verdict_colour),
    ),
)

HISTORY = Table(
    "history",
    (
        col("order", None, None),
        col("run", "run", None, CONSOLE),
        col("vllm", "vLLM", None, CONSOLE),
        col("time_order", "run # in time", "{}", CONSOLE),
        col("started", "started", None, CONSOLE),
        col("finished", "finished", "{}", CONSOLE),  # False: the run stopped short (compare.unfinished)
        col("series", None, None),
        col("arm", "arm", None, CONSOLE),
        point_col(CONSOLE),
        CONCURRENCY,
        col("estimate_ms", "ms/tok", views=CONSOLE),
        Col("95 % CI", lambda r: interval(r.get("ci_lo_ms"), r.get("ci_hi_ms")), ("ci_lo_ms", "ci_hi_ms"), CONSOLE),
        col("n_cells", "servers", "{}", CONSOLE),
        col("ci_kind", "interval", None, CONSOLE),
        col("estimator", None, None),
    ),
)


# -- build ------------------------------------------------------------------------------------------
def run_facts(a: Any) -> dict[str, Any]:
    m, cfg = a.manifest, a.config  # the config as run, typed (run_folder.RunRecord.config)
    model = m.get("model") or {}
    wl, server = cfg.workload, cfg.server
    cs = sorted({p.concurrency for p in a.points})
    overrides = None
    if server.allow_harness_flag_overrides:
        overrides = list(m.get("harness_flag_overrides") or [])
    return {
        "run_id": m.get("run_id"),
        "command": m.get("command") or "run",
        "status": a.status,  # harness-died when nobody holds it
        "status_note": m.get("status_note"),
        "exit_status": m.get("exit_status"),
        "error": m.get("error"),
        "started": m.get("started"),
        "ended": m.get("ended"),
        "vllm": vllm_version(m),
        "gpu": gpu_name(m),
        "model": model.get("path"),
        "twin_of": model.get("twin_of"),
        "tp": a.tp,
        "graph_mode": server.graph_mode,
        "eager": not server.cuda_graphs,
        "compile_cache": server.compile_cache,
        "server_mode": m.get("server_mode"),
        "order": cfg.run.order,
        "passes": a.passes,
        "depths": sorted({p.depth for p in a.points}),
        "arms": a.arms,
        "reference_arm": a.reference,
        "long_tokens": a.n_long,
        "short_tokens": a.n_short,
        "rounds": wl.rounds,
        "target_ci_pct": wl.target_ci_pct,
        "replication": m.get("replication"),
        "alpha": a.alpha,
        "min_effect_pct": a.min_effect_pct,
        "target_mde_pct": a.target_mde_pct,
        "estimator": a.estimator,
        "estimator_note": a.estimator_note,
        "estimator_definition": estimate.describe(a.estimator, a.n_long, a.n_short),
        "estimator_by_point": a.estimator_by_point,  # per arm and point: which estimator and why
        "gpu_time": a.gpu_time(),
        "git": m.get("git"),
        "code": identity.describe(m),
        "harness_flag_overrides": overrides,
        # only above batch 1, so batch-1 summaries stay what they were
        **({"concurrency": cs, "route": "primed"} if max(cs, default=1) > 1 else {}),
    }


def cells(a: Any) -> list[dict[str, Any]]:
    """The analysis's cell table, plus the row fields CELLS takes from cells.jsonl and the server
    that served each cell (cells of one server share it: the figures join only those)."""
    out = []
    fields = CELLS.row_fields()
    for row in a.cell_table():
        raw = a.cell_rows.get(row["cell_id"]) or {}
        key = (row["arm"], Point.of(row), row["pass"])
        out.append(
            {**row, **{k: raw.get(k) for k in fields}, "server": a.server_of.get(key) if key in a.cells else None}
        )
    return out


def routing_warnings(a: Any) -> list[dict[str, Any]]:
    """Per cell, why its routing is not (all) a result: the fold's own warnings, and the step
    counts missing where the step hook never fired (judged from the row, so old rows too)."""
    out = []
    for cid, c in a.cell_rows.items():
        r = c.get("routing")
        if not isinstance(r, dict):
            continue
        said = list(r.get("warnings") or [])
        for w in said + [g for g in routing.step_gaps(r) if g not in said]:
            out.append({"cell_id": cid, "arm": c.get("arm"), "warning": w})
    return out


def build(a: Any, gsm8k: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """summary.json of an analysed run (e2e.analysis.run_analysis.RunAnalysis); gsm8k: the sign-off summaries
    found in the run folder ([{file, content}])."""
    conc = a.concurrency()
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "e2e-run-summary",
        "run": run_facts(a),
        "cells": cells(a),
        "arms": a.arm_table(),
        "comparisons": a.comparisons,
        "routing": a.routing_table(),
        "routing_warnings": routing_warnings(a),
        "startups": a.startup_table(),
        "start_phases": a.start_phases(),
        "correction": a.correction,
        "pass_agreement": a.agreement,
        "max_pass_disagreement_pct": a.max_pass_disagreement_pct(),
        "executor": conc,
        "slots": a.slots if conc["n_slots"] else None,  # only where the executors recorded slots
        "roofline": a.roofline,
        "variance_model": a.fit.to_dict() if a.fit else None,
        "gpu_state": gpu_section(a),
        "gsm8k": gsm8k or [],
        # only for runs above batch 1, so batch-1 summaries stay what they were
        **({"load": load} if (load := a.load()) is not None else {}),
        # only where the harness took profiles (e2e/profile/section.py), so older summaries stay what they were
        **({"profile": prof} if (prof := kernel_profile(a)) is not None else {}),
        "warnings": a.warnings + [w for w in report_gpu.warnings(a.cell_rows.values()) if w not in a.warnings],
    }


def kernel_profile(a: Any) -> dict[str, Any] | None:
    """Where each arm's decode step goes, per point, and what differs (e2e/profile/section.py)."""
    from e2e.profile import section

    return section.summarise(a.root, a.config, list(a.arms), sorted(a.points), a.comparisons)


def gpu_section(a: Any) -> dict[str, Any] | None:
    """The GPU's state around the cells and each server's bookend (e2e/report/report_gpu.py), as the
    report shows them; None for a run from before either was recorded."""
    rows = list(a.cell_rows.values())
    if not any(r.get("gpu_state") or r.get("bookend") for r in rows):
        return None
    return {"markdown": report_gpu.section(rows), "bookends": a.bookends}
