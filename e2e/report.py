"""summary.json, summary.csv, comparisons.csv, report.md and PNG figures for one run folder.

    python run_e2e.py report results/<run-id>

Every figure comes from e2e.analysis, which reads only the rows on disk; a report can be deleted and
recomputed at any time. Every file written carries SCHEMA_VERSION (a key in JSON, a column in
CSV, a line in Markdown).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from e2e import estimate, report_md, tables
from e2e.analysis import RunAnalysis, gpu_name, graph_mode, vllm_version
from e2e.formats import VERSIONS
from e2e.live_servers import effective_status
from e2e.safe_io import check_closed, write_atomic
from e2e.store import write_json_atomic

SCHEMA_VERSION = VERSIONS["summary"]

FILES = ("summary.json", "summary.csv", "comparisons.csv", "report.md",
         "decode_vs_depth.png", "ratio_vs_depth.png")






def run_facts(a: RunAnalysis) -> dict[str, Any]:
    m, cfg = a.manifest, a.manifest.get("config") or {}
    model = m.get("model") or {}
    wl = cfg.get("workload") or {}
    return {"run_id": m.get("run_id"), "status": effective_status(a.root, m.get("status")),  # harness-died
            "started": m.get("started"), "ended": m.get("ended"), "vllm": vllm_version(m), "gpu": gpu_name(m),
            "model": model.get("path"), "twin_of": model.get("twin_of"), "tp": a.tp,
            "graph_mode": graph_mode(cfg), "server_mode": m.get("server_mode"),
            "order": (cfg.get("run") or {}).get("order"), "passes": a.passes, "depths": a.depths,
            "arms": a.arms, "reference_arm": a.reference, "long_tokens": a.n_long,
            "short_tokens": a.n_short, "rounds": wl.get("rounds"), "target_ci_pct": wl.get("target_ci_pct"),
            "replication": m.get("replication"),
            "alpha": a.alpha, "min_effect_pct": a.min_effect_pct, "target_mde_pct": a.target_mde_pct,
            "estimator": a.estimator, "estimator_note": a.estimator_note,
            "estimator_definition": estimate.describe(a.estimator, a.n_long, a.n_short),
            "gpu_time": a.gpu_time(), "git": m.get("git")}


def gsm8k_summaries(run_dir: Path) -> list[tuple[Path, Any]]:
    """Summary files the gsm8k step left under <run>/gsm8k/ (format owned by that step)."""
    folder = run_dir / "gsm8k"
    out = []
    if folder.is_dir():
        for p in sorted(folder.rglob("*.json")):
            if "summary" in p.name or "verdict" in p.name:
                try:
                    out.append((p, json.loads(p.read_text())))
                except (OSError, json.JSONDecodeError) as exc:
                    out.append((p, {"error": f"unreadable: {exc}"}))
    return out


def summary(a: RunAnalysis) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "kind": "e2e-run-summary", "run": run_facts(a),
            "cells": a.cell_table(), "arms": a.arm_table(), "comparisons": a.comparisons,
            "routing": a.routing_table(), "startups": a.startup_table(), "start_phases": a.start_phases(),
            "correction": a.correction, "pass_agreement": a.agreement, "max_pass_disagreement_pct": a.max_pass_disagreement_pct(),
            "roofline": a.roofline, "variance_model": a.fit.to_dict() if a.fit else None,
            "warnings": a.warnings}




CELL_COLS = ["cell_id", "pass", "arm", "depth", "status", "stopped_by", "estimator", "estimate_ms", "ci_lo_ms",
             "ci_hi_ms", "half_width_pct", "robust_se_pct", "cv_pct", "n_rounds", "n_valid_long", "n_valid_short",
             "n_invalid", "client_estimate_ms", "client_gap_pct", "client_agrees", "server_estimate_ms",
             "server_disagreement_pct", "startup_s", "warnings"]
CMP_COLS = ["arm", "reference", "depth", "scope", "pass", "ratio", "ratio_ci_lo", "ratio_ci_hi",
            "ci_kind", "p_value", "p_adjusted", "p_equiv", "p_equiv_adjusted", "df", "mde_pct", "alpha_step",
            "servers_needed", "target_mde_pct", "diff_ms", "diff_ci_lo_ms", "diff_ci_hi_ms", "decision", "decision_unadjusted",
            "correction", "warnings"]


def write_report(run_dir: Path | str) -> list[Path]:
    """Analyse a run folder and write its report files into it; returns the paths written."""
    root = Path(run_dir)
    check_closed(root)  # a link in the folder: refused before a row is read or a file written
    a = RunAnalysis(root)
    s = summary(a)
    s["gsm8k"] = [{"file": str(p.relative_to(root)), "content": c} for p, c in gsm8k_summaries(root)]
    written = []
    write_json_atomic(root / "summary.json", s)
    written.append(root / "summary.json")
    tables.write_csv(root / "summary.csv", s["cells"], CELL_COLS, SCHEMA_VERSION)
    tables.write_csv(root / "comparisons.csv", s["comparisons"], CMP_COLS, SCHEMA_VERSION)
    written += [root / "summary.csv", root / "comparisons.csv"]
    written += figures(a, root)
    write_atomic(root / "report.md", report_md.markdown(a, s))
    written.append(root / "report.md")
    return written


# -- figures ------------------------------------------------------------------------------------
def figures(a: RunAnalysis, root: Path) -> list[Path]:
    out = []
    fig, ax = tables.new_figure()
    for arm in a.arms:
        for p in a.passes:
            pts = [(d, a.cells[(arm, d, p)]) for d in a.depths
                   if (arm, d, p) in a.cells and a.cells[(arm, d, p)].estimate is not None]
            if not pts:
                continue
            xs = [d for d, _ in pts]
            ys = [c.estimate for _, c in pts]
            err = [[c.estimate - c.ci[0] if c.ci else 0 for _, c in pts],
                   [c.ci[1] - c.estimate if c.ci else 0 for _, c in pts]]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=f"{arm} pass {p}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context depth (tokens)")
    ax.set_ylabel("decode ms per token (95 % CI)")
    ax.set_title(f"Decode ms/token vs depth, (T{a.n_long} - T{a.n_short}) / {a.n_long - a.n_short}")
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=8)
    out.append(tables.save_figure(fig, root / "decode_vs_depth.png"))

    fig, ax = tables.new_figure()
    band = a.min_effect_pct / 100
    ax.axhspan(1 - band, 1 + band, color="grey", alpha=0.15, label=f"min effect ±{a.min_effect_pct:g} %")
    ax.axhline(1.0, color="black", lw=0.8)
    for arm in a.arms[1:]:
        rows = [c for c in a.comparisons if c["arm"] == arm and c["scope"] == "pooled"
                and c["ratio"] is not None]
        if rows:
            xs = [c["depth"] for c in rows]
            ys = [c["ratio"] for c in rows]
            lo = [c["ratio"] - c["ratio_ci_lo"] if c["ratio_ci_lo"] is not None else 0 for c in rows]
            hi = [c["ratio_ci_hi"] - c["ratio"] if c["ratio_ci_hi"] is not None else 0 for c in rows]
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="s", capsize=4, label=f"{arm} / {a.reference} (pooled)")
        pp = [c for c in a.comparisons if c["arm"] == arm and c["scope"] == "pass" and c["ratio"] is not None]
        if pp:
            ax.scatter([c["depth"] for c in pp], [c["ratio"] for c in pp], marker="x", alpha=0.6,
                       label=f"{arm} / {a.reference} per pass")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context depth (tokens)")
    ax.set_ylabel("ratio of decode ms/token (> 1: slower than reference)")
    ax.set_title("Arm ratio per depth (95 % CI)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    out.append(tables.save_figure(fig, root / "ratio_vs_depth.png"))
    return out
