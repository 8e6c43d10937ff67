"""summary.json, summary.csv, comparisons.csv, report.md and PNG figures for one run folder.

    python run_e2e.py report results/<run-id>

Every figure comes from e2e.analysis, which reads only the rows on disk; a report can be deleted and
recomputed at any time. Every file written carries SCHEMA_VERSION (a key in JSON, a column in
CSV, a line in Markdown).
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from e2e import stats, tables
from e2e.analysis import RunAnalysis, gpu_name, vllm_version
from e2e.formats import VERSIONS
from e2e.store import write_json_atomic
from e2e.tables import interval, num

SCHEMA_VERSION = VERSIONS["summary"]

FILES = ("summary.json", "summary.csv", "comparisons.csv", "report.md",
         "decode_vs_depth.png", "ratio_vs_depth.png")






def graph_mode(cfg: dict[str, Any]) -> str:
    s = cfg.get("server") or {}
    if not s.get("cuda_graphs", True):
        return "eager (--enforce-eager: no compile, no CUDA graphs)"
    if s.get("compilation_config"):
        return f"-cc {s['compilation_config']}"
    return "vLLM default (torch.compile + CUDA graphs FULL_AND_PIECEWISE)"


def run_facts(a: RunAnalysis) -> dict[str, Any]:
    m, cfg = a.manifest, a.manifest.get("config") or {}
    model = m.get("model") or {}
    wl = cfg.get("workload") or {}
    return {"run_id": m.get("run_id"), "status": m.get("status"), "started": m.get("started"),
            "ended": m.get("ended"), "vllm": vllm_version(m), "gpu": gpu_name(m),
            "model": model.get("path"), "twin_of": model.get("twin_of"), "tp": a.tp,
            "graph_mode": graph_mode(cfg), "server_mode": m.get("server_mode"),
            "order": (cfg.get("run") or {}).get("order"), "passes": a.passes, "depths": a.depths,
            "arms": a.arms, "reference_arm": a.reference, "long_tokens": a.n_long,
            "short_tokens": a.n_short, "rounds": wl.get("rounds"), "target_ci_pct": wl.get("target_ci_pct"),
            "alpha": a.alpha, "min_effect_pct": a.min_effect_pct, "git": m.get("git")}


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
            "routing": a.routing_table(), "startups": a.startup_table(),
            "pass_agreement": a.agreement, "max_pass_disagreement_pct": a.max_pass_disagreement_pct(),
            "roofline": a.roofline, "warnings": a.warnings}




CELL_COLS = ["cell_id", "pass", "arm", "depth", "status", "stopped_by", "estimate_ms", "ci_lo_ms",
             "ci_hi_ms", "half_width_pct", "cv_pct", "n_rounds", "n_valid_long", "n_valid_short",
             "n_invalid", "server_estimate_ms", "server_disagreement_pct", "startup_s", "warnings"]
CMP_COLS = ["arm", "reference", "depth", "scope", "pass", "ratio", "ratio_ci_lo", "ratio_ci_hi",
            "p_value", "test", "diff_ms", "diff_ci_lo_ms", "diff_ci_hi_ms", "decision", "warnings"]


def write_report(run_dir: Path | str) -> list[Path]:
    """Analyse a run folder and write its report files into it; returns the paths written."""
    root = Path(run_dir)
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
    (root / "report.md").write_text(markdown(a, s, root))
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


# -- markdown -----------------------------------------------------------------------------------


def markdown(a: RunAnalysis, s: dict[str, Any], root: Path) -> str:
    f = s["run"]
    md = [f"# {f['run_id']}: decode latency report", "",
          f"<!-- schema_version {SCHEMA_VERSION}; recomputed from the rows by `run_e2e.py report` -->", ""]
    if f["twin_of"]:
        md += [f"> **WARNING: RANDOM-WEIGHT TWIN.** The model served is `{f['model']}`, a random-weight "
               f"twin of `{f['twin_of']}`: same shapes and format, NOT the real model. Latency only; "
               "no accuracy figure here means anything.", ""]
    md += [tables.markdown(["", ""], [
        ["vLLM", f["vllm"] or "unknown"], ["GPU", f["gpu"] or "none recorded (CPU?)"],
        ["model", f"`{f['model']}`" + (f" (twin of `{f['twin_of']}`)" if f["twin_of"] else "")],
        ["tensor parallel", str(f["tp"])], ["graph mode", f["graph_mode"]],
        ["server mode", str(f["server_mode"])], ["order / passes", f"{f['order']} / {len(f['passes'])}"],
        ["arms (reference first)", ", ".join(f["arms"])],
        ["estimate", f"(median T{f['long_tokens']} - median T{f['short_tokens']}) / "
                     f"{f['long_tokens'] - f['short_tokens']}, {f['rounds']} rounds"
                     + (f", target CI {f['target_ci_pct']} %" if f["target_ci_pct"] else "")],
        ["decision rule", f"p < {f['alpha']} and 95 % CI excludes 1 and \\|ratio - 1\\| >= {f['min_effect_pct']:g} %"],
        ["run status", f"{f['status']} ({f['started']} to {f['ended']})"],
        ["git", json.dumps(f["git"])]]), ""]

    md += ["## Arms compared (pooled over passes; a server is one replicate)", ""]
    pooled = [c for c in s["comparisons"] if c["scope"] == "pooled"]
    md += [tables.markdown(["arm / ref", "depth", "ratio", "95 % CI", "diff ms/tok (CI)", "p", "test", "decision"],
                  [[f"{c['arm']} / {c['reference']}", str(c["depth"]), num(c["ratio"], "{:.3f}"),
                    interval(c['ratio_ci_lo'], c['ratio_ci_hi'], '{:.3f}'),
                    f"{num(c['diff_ms'], '{:+.2f}')} ({num(c['diff_ci_lo_ms'], '{:+.2f}')}..{num(c['diff_ci_hi_ms'], '{:+.2f}')})",
                    num(c["p_value"], "{:.3g}"), c["test"], f"**{c['decision']}**"] for c in pooled])
           if pooled else "Only one arm: nothing to compare.", ""]
    per_pass = [c for c in s["comparisons"] if c["scope"] == "pass"]
    if per_pass:
        md += ["Per pass (within two servers only: the interval leaves out between-server variance):", "",
               tables.markdown(["arm / ref", "depth", "pass", "ratio", "95 % CI", "p", "decision"],
                      [[f"{c['arm']} / {c['reference']}", str(c["depth"]), str(c["pass"]),
                        num(c["ratio"], "{:.3f}"),
                        interval(c['ratio_ci_lo'], c['ratio_ci_hi'], '{:.3f}'),
                        num(c["p_value"], "{:.3g}"), c["decision"]] for c in per_pass]), ""]
    md += ["![arm ratio per depth](ratio_vs_depth.png)", ""]

    md += ["## Cells", "", tables.markdown(
        ["cell", "status", "ms/token", "95 % CI", "±%", "CV %", "rounds", "server ms/tok", "client-server %", "stopped by"],
        [[c["cell_id"], c["status"], num(c.get("estimate_ms")),
          interval(c.get('ci_lo_ms'), c.get('ci_hi_ms')), num(c.get("half_width_pct"), "{:.1f}"),
          num(c.get("cv_pct"), "{:.1f}"), num(c.get("n_rounds"), "{}"), num(c.get("server_estimate_ms")),
          num(c.get("server_disagreement_pct"), "{:+.1f}"), str(c.get("stopped_by") or "-")]
         for c in s["cells"]]), "", "![decode ms/token vs depth](decode_vs_depth.png)", ""]

    md += ["## Pass agreement (same arm, same depth, across passes)", ""]
    ag = [x for x in s["pass_agreement"] if x["max_rel_diff_pct"] is not None]
    if ag:
        md += [f"At most {s['max_pass_disagreement_pct']:.1f} % apart.", "",
               tables.markdown(["arm", "depth", "largest difference %", "beyond the intervals"],
                      [[x["arm"], str(x["depth"]), num(x["max_rel_diff_pct"], "{:.1f}"),
                        "**yes**" if x["flagged"] else "no"] for x in ag]), ""]
    else:
        md += ["One pass only: no agreement to report.", ""]

    md += ["## HBM floor (bytes one decode step must read / memory bandwidth)", ""]
    rf = s["roofline"]
    if not rf.get("available"):
        md += [f"Floor unavailable: {rf.get('reason')}.", ""]
    else:
        md += [f"{rf['gpu'] or 'GPU'} at {rf['bandwidth_gbps']:.0f} GB/s ({rf['bandwidth_source']}), TP {rf['tp']}, "
               f"weights {rf['quantization']} ({rf['weight_bits']:.3f} bits/weight), "
               f"{rf['global_layers']} global + {rf['sliding_layers']} sliding layers (window {rf['window']}).", "",
               tables.markdown(["depth", "GB/step/GPU (weights + lm_head + KV)", "floor ms", "measured / floor"],
                      [[d, f"{e['bytes_per_gpu']['total'] / 1e9:.2f} ({e['bytes_per_gpu']['weights'] / 1e9:.2f} + "
                           f"{e['bytes_per_gpu']['lm_head'] / 1e9:.2f} + {e['bytes_per_gpu']['kv'] / 1e9:.2f})",
                        f"{e['floor_ms']:.3f}",
                        "; ".join(f"{arm} " + ", ".join(f"{x:.2f}x" for x in v)
                                  for arm, v in e.get("measured_over_floor", {}).items() if v) or "-"]
                       for d, e in rf["per_depth"].items()]), ""]

    starts = s.get("startups") or []
    if any(r["starts"] for r in starts):
        f = lambda x: "-" if x is None else f"{x:.1f}"
        md += ["## Server starts", "",
               f"Compile cache: `{(a.manifest.get('config') or {}).get('server', {}).get('compile_cache', 'vllm-default (not recorded: the run predates the setting)')}` "
               "(per-arm: each arm's later starts reuse what its first start compiled; never across arms).", "",
               tables.markdown(["arm", "starts", "first s", "later median s", "saved per start s"],
                      [[r["arm"], str(r["starts"]), f(r["first_s"]), f(r["later_median_s"]), f(r["saved_per_start_s"])]
                       for r in starts]), ""]
    md += ["## Routing (recorded inside the vLLM processes)", ""]
    routing = s.get("routing") or []
    if routing:
        md += ["Counted by the project's plugin in every vLLM process (per-process records in "
               "`cells/*/records-*/`, folded into each cell's `routing` in cells.jsonl). Under full CUDA "
               "graphs, counts come from capture and eager steps, not from replays.", "",
               tables.markdown(["arm", "layer class / gate", "path", "layers", "processes", "graphs", "cells"],
                      [[r["arm"], f"`{r['what']}`", str(r["path"]), str(r["n_layers"]) if r["n_layers"] is not None else "-",
                        ", ".join(r["processes"]), ", ".join(r["graphs"]) or "-", str(len(r["cells"]))]
                       for r in routing]), ""]
    if not routing:
        md += ["No routing records in this run (the plugin was off, or no records arrived).", ""]

    gs = s.get("gsm8k") or []
    if gs:
        md += ["## GSM8K", ""]
        for g in gs:
            c = g["content"]
            if isinstance(c, dict) and "verdict" in c:
                md.append(f"**Verdict ({g['file']}): {c['verdict']}**")
                md.append("")
            md += [f"`{g['file']}`:", "", "```json", json.dumps(c, indent=1, default=str)[:4000], "```", ""]

    md += [f"## Warnings ({len(s['warnings'])})", ""]
    md += [f"- {w}" for w in s["warnings"]] or ["None."]
    md.append("")
    return "\n".join(md)


# -- command line -------------------------------------------------------------------------------
def add_report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a run folder (results/<run-id>)")


def report_main(args: argparse.Namespace) -> int:
    """Write the report files and print where they are; 0 on success (UserError on a bad folder)."""
    paths = write_report(Path(args.run_dir))
    for p in paths:
        print(p)
    return 0
