"""report.md's account of the machine: the GPU's state, the HBM floor, the server starts and the
attention routing recorded inside the vLLM processes."""

from __future__ import annotations

import re
from typing import Any

from e2e.report import summary as sm
from e2e.report.tables import num, render_markdown


def gpu_state(s: dict[str, Any]) -> list[str]:
    """The GPU's state around the cells: its place in the report. e2e/report/report_gpu.py (issue of the
    GPU-state work) fills summary.json's `gpu_state` and renders it here; None: nothing recorded."""
    g = s.get("gpu_state")
    if not g:
        return []
    return [*(g.get("markdown") or []), ""]  # report_gpu.section: its own heading


# -- the machine: floor and starts ------------------------------------------------------------------
def floor(s: dict[str, Any]) -> list[str]:
    rf, tp = s["roofline"], s["run"]["tp"]
    md = ["## HBM floor (bytes one decode step must read / memory bandwidth)", ""]
    if not rf.get("available"):
        return md + [f"Floor unavailable: {rf.get('reason')}.", ""]
    sheet = (
        f"{rf['bandwidth_gbps']:.0f} GB/s ({rf['bandwidth_source']})"
        if rf.get("bandwidth_gbps")
        else f"no datasheet figure ({rf['bandwidth_source']})"
    )
    measured = (
        f"{rf['measured_bandwidth_gbps']:.0f} GB/s measured in this run "
        f"({num(rf.get('measured_fraction_of_datasheet'), '{:.0%}')} of the datasheet; "
        f"{rf['measured_bandwidth_source']})"
        if rf.get("measured_bandwidth_gbps")
        else "no measured bandwidth in this run's manifest"
    )
    md += [
        f"{rf['gpu'] or 'GPU'}: datasheet {sheet}; {measured}. TP {rf['tp']}, weights {rf['quantization']} "
        f"({rf['weight_bits']:.3f} bits/weight), {rf['global_layers']} global + {rf['sliding_layers']} sliding "
        f"layers (window {rf['window']}).",
        "",
    ]
    if tp > 1:
        md += [
            f"At tensor parallel {tp} the floor counts each GPU's share of the bytes and leaves out the "
            "all-reduces between GPUs: measured / floor is larger for that reason too.",
            "",
        ]
    return md + [render_markdown(sm.FLOOR, [{"depth": d, **e} for d, e in rf["per_depth"].items()]), ""]


def starts(s: dict[str, Any]) -> list[str]:
    f, rows = s["run"], s.get("startups") or []
    if not any(r["starts"] for r in rows):
        return []
    if f.get("eager"):  # no torch.compile and no CUDA graphs: no cache to credit
        what = (
            "No compile cache applies: the servers ran eager (`--enforce-eager`: no torch.compile, no "
            "CUDA graphs), so a later start's difference from the first is not a cache's saving (the OS's "
            "file cache, the machine's load)."
        )
        saved = "first - later median s"
    else:
        cache = f.get("compile_cache") or "vllm-default (not recorded: the run predates the setting)"
        what = (
            f"Compile cache: `{cache}` (per-arm: each arm's later starts reuse what its first start "
            "compiled; never across arms)."
        )
        saved = "saved per start s"
    missed = [
        f"{r['arm']}: {r['later_cache_misses']} of {r['starts'] - 1} later" for r in rows if r.get("later_cache_misses")
    ]
    if missed and not f.get("eager"):
        what += (
            " Later starts whose log says the cache missed compiled like a first one (a resume on "
            f"another machine, a changed compile key): {', '.join(missed)}; the saving is taken from "
            "the later starts that hit it (none: `-`)."
        )
    md = ["## Server starts", "", what, "", render_markdown(sm.STARTS, rows, saved=saved), ""]
    if s.get("start_phases"):
        md += [
            "Where each start went, read from the server's own log (seconds; vLLM's log has one-second "
            "time stamps; `before vLLM's log` is the interpreter starting and importing vLLM; the cache "
            "column is whether torch.compile loaded its graphs"
            + ("; eager: there is no torch.compile, so it stays empty" if f.get("eager") else "")
            + "):",
            "",
            render_markdown(sm.PHASES, s["start_phases"]),
            "",
        ]
    return md


# -- routing ------------------------------------------------------------------------------------------
def routing(s: dict[str, Any]) -> list[str]:
    md = ["## Routing (recorded inside the vLLM processes)", ""]
    rows, warned = s.get("routing") or [], s.get("routing_warnings") or []
    if rows:
        md += [
            "Counted by the project's plugin in every vLLM process (per-process records in "
            "`cells/*/records-*/`, folded into each cell's `routing` in cells.jsonl). Under full CUDA "
            "graphs, counts come from capture and eager steps, not from replays.",
            "",
            render_markdown(sm.ROUTING, rows),
            "",
        ]
    if warned:  # never an empty or partial routing table that looks like a result
        md += [
            f"**Routing warnings** ({len(warned)}): for these cells the routing above is incomplete or "
            "unknown (their latency stands):",
            "",
        ]
        groups: dict[tuple[str, str], list[str]] = {}
        for w in warned:  # one line per arm and message; process ids differ from server to server
            groups.setdefault((w["arm"], re.sub(r" pid \d+", "", w["warning"])), []).append(w["cell_id"])
        md += [
            f"- {arm}, {len(cids)} cell(s) ({', '.join(f'`{c}`' for c in cids)}): {text}"
            for (arm, text), cids in groups.items()
        ] + [""]
    if not rows and not warned:
        md += ["No routing records in this run (the plugin was off, or no records arrived).", ""]
    return md
