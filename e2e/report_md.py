"""report.md: the run's summary (report.summary) as markdown, section by section. Every number
comes from the summary; nothing here computes a statistic."""
from __future__ import annotations

import json
from typing import Any

from e2e import tables
from e2e.analysis import RunAnalysis
from e2e.formats import VERSIONS
from e2e.tables import interval, num

SCHEMA_VERSION = VERSIONS["summary"]




def _override_row(m: dict[str, Any]) -> list[list[str]]:
    """A row only when server.allow_harness_flag_overrides was set: which args overrode the harness."""
    if not ((m.get("config") or {}).get("server") or {}).get("allow_harness_flag_overrides"):
        return []
    used = m.get("harness_flag_overrides") or []
    return [["harness flag overrides", "**allowed** (server.allow_harness_flag_overrides): "
             + ("; ".join(f"`{u}`" for u in used) if used else "none used")]]


def markdown(a: RunAnalysis, s: dict[str, Any]) -> str:
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
        ["estimate", f"{f['estimator_definition']}, {f['rounds']} rounds"
                     + (f", target CI {f['target_ci_pct']} %" if f["target_ci_pct"] else "")],
        ["estimator", f"**{f['estimator']}**: {f['estimator_note']}; the plain client estimate is in every "
                      "cell row as the check (Cells: `client ms/tok`)"],
        ["decision rule", f"alpha {f['alpha']:g} (family-wise, Holm), min effect {f['min_effect_pct']:g} %: "
                          "see Verdicts"],
        ["replication", _replication(f.get("replication"), len(f["passes"]))],
        ["executor", executor_line(a.concurrency())],
        ["GPU time", _gpu_time(f.get("gpu_time"))],
        ["run status", f"{f['status']} ({f['started']} to {f['ended']})"],
        ["git", json.dumps(f["git"])]] + _override_row(a.manifest)), ""]

    md += verdict_section(s)
    md += ["![arm ratio per depth](ratio_vs_depth.png)", ""]

    md += ["## Cells", "", tables.markdown(
        ["cell", "status", "ms/token", "95 % CI", "±%", "robust se %", "CV %", "rounds", "client ms/tok",
         "client - est %", "server ms/tok", "est - server %", "stopped by"],
        [[c["cell_id"], c["status"], num(c.get("estimate_ms")),
          interval(c.get('ci_lo_ms'), c.get('ci_hi_ms')), num(c.get("half_width_pct"), "{:.1f}"),
          num(c.get("robust_se_pct"), "{:.2f}"), num(c.get("cv_pct"), "{:.1f}"), num(c.get("n_rounds"), "{}"),
          num(c.get("client_estimate_ms")),
          num(c.get("client_gap_pct"), "{:+.2f}") + (" **(disagrees)**" if c.get("client_agrees") is False else ""),
          num(c.get("server_estimate_ms")), num(c.get("server_disagreement_pct"), "{:+.1f}"),
          str(c.get("stopped_by") or "-")]
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

    md += slots_section(a.slots, a.concurrency(), a.alpha)
    md += floor_section(s["roofline"], a.tp)
    md += starts_section(a, s)
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
    warned = [(cid, c.get("arm"), w) for cid, c in a.cell_rows.items()
              if isinstance(c.get("routing"), dict) for w in c["routing"].get("warnings") or []]
    if warned:  # never an empty or partial routing table that looks like a result
        md += ["**Routing warnings**: for these cells the routing above is incomplete or unknown "
               "(their latency stands):", ""] + [f"- `{cid}` ({arm}): {w}" for cid, arm, w in warned] + [""]
    if not routing and not warned:
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


def executor_line(c: dict[str, Any]) -> str:
    """How the cells ran: which executor(s), on how many slots, how many at once."""
    kinds = " then ".join(dict.fromkeys(c["executors"]))
    if "ray" not in c["executors"]:
        return f"{kinds}: one cell at a time on this host"
    return (f"{kinds} (Ray: {c['ray_address']}): {c['n_slots']} slot(s) on {c['hosts']} host(s); at most "
            f"**{c['max_at_once_per_host']} cell(s) at once per host** (cap {c['max_per_host_cap']}), "
            f"{c['max_at_once']} at once in all")


def slots_section(sl: dict[str, Any], c: dict[str, Any], alpha: float = 0.05) -> list[str]:
    """Only for runs where some cells ran on Ray slots: cells per slot and the slot effect."""
    per = sl.get("per_slot") or {}
    if "ray" not in c["executors"] or not per:
        return []
    p = sl.get("p_value")
    md = ["## Slots (where the cells ran: a blocking factor)", "",
          f"{executor_line(c)}. Arms over the slots as run: "
          + ("**balanced**" if sl.get("balanced_as_run") else "**not balanced** (see Warnings)")
          + f". Slot effect ({sl['test']}): "
          + (f"p = {p:.3g}" + (" **(slots differ)**" if p < alpha else "") if p is not None
             else "not testable (one slot, or too few cells)") + ".", "",
          tables.markdown(["slot", "host", "cells", "arms", "mean deviation from the arm and depth mean %"],
                          [[name, str(v.get("host")), str(v["n_cells"]),
                            ", ".join(f"{k} {n}" for k, n in (v.get("arms") or {}).items()),
                            num(v.get("mean_dev_pct"), "{:+.2f}")] for name, v in per.items()]), ""]
    return md


def _over(per_arm: dict[str, list[float]]) -> str:
    return "; ".join(f"{arm} " + ", ".join(f"{x:.2f}x" for x in v) for arm, v in per_arm.items() if v) or "-"


def floor_section(rf: dict[str, Any], tp: int) -> list[str]:
    md = ["## HBM floor (bytes one decode step must read / memory bandwidth)", ""]
    if not rf.get("available"):
        return md + [f"Floor unavailable: {rf.get('reason')}.", ""]
    sheet = (f"{rf['bandwidth_gbps']:.0f} GB/s ({rf['bandwidth_source']})" if rf.get("bandwidth_gbps")
             else f"no datasheet figure ({rf['bandwidth_source']})")
    measured = (f"{rf['measured_bandwidth_gbps']:.0f} GB/s measured in this run "
                f"({num(rf.get('measured_fraction_of_datasheet'), '{:.0%}')} of the datasheet; "
                f"{rf['measured_bandwidth_source']})" if rf.get("measured_bandwidth_gbps")
                else "no measured bandwidth in this run's manifest")
    md += [f"{rf['gpu'] or 'GPU'}: datasheet {sheet}; {measured}. TP {rf['tp']}, weights {rf['quantization']} "
           f"({rf['weight_bits']:.3f} bits/weight), {rf['global_layers']} global + {rf['sliding_layers']} sliding "
           f"layers (window {rf['window']}).", ""]
    if tp > 1:
        md += [f"At tensor parallel {tp} the floor counts each GPU's share of the bytes and leaves out the "
               "all-reduces between GPUs: measured / floor is larger for that reason too.", ""]
    md += [tables.markdown(
        ["depth", "GB/step/GPU (weights + lm_head + KV)", "floor ms (datasheet)", "measured / floor",
         "floor ms (measured bw)", "measured / that floor"],
        [[d, f"{e['bytes_per_gpu']['total'] / 1e9:.2f} ({e['bytes_per_gpu']['weights'] / 1e9:.2f} + "
             f"{e['bytes_per_gpu']['lm_head'] / 1e9:.2f} + {e['bytes_per_gpu']['kv'] / 1e9:.2f})",
          num(e.get("floor_ms"), "{:.3f}"), _over(e.get("measured_over_floor") or {}),
          num(e.get("floor_measured_ms"), "{:.3f}"), _over(e.get("measured_over_measured_floor") or {})]
         for d, e in rf["per_depth"].items()]), ""]
    return md


PHASE_COLS = (("startup_s", "start s"), ("before_log_s", "before vLLM's log"),
              ("api_to_engine_s", "API -> engine"), ("engine_to_worker_s", "engine -> worker"),
              ("weights_s", "weights"), ("compile_s", "torch.compile"), ("compile_cache", "cache"),
              ("graph_capture_s", "graph capture"), ("after_capture_s", "capture -> init end"),
              ("init_end_to_api_s", "init end -> API"))


def starts_section(a: RunAnalysis, s: dict[str, Any]) -> list[str]:
    starts = s.get("startups") or []
    if not any(r["starts"] for r in starts):
        return []
    cache = (a.manifest.get("config") or {}).get("server", {}).get(
        "compile_cache", "vllm-default (not recorded: the run predates the setting)")
    md = ["## Server starts", "",
          f"Compile cache: `{cache}` (per-arm: each arm's later starts reuse what its first start compiled; "
          "never across arms).", "",
          tables.markdown(["arm", "starts", "first s", "later median s", "saved per start s"],
                          [[r["arm"], str(r["starts"]), num(r["first_s"], "{:.1f}"), num(r["later_median_s"], "{:.1f}"),
                            num(r["saved_per_start_s"], "{:.1f}")] for r in starts]), ""]
    phases = s.get("start_phases") or []
    if phases:
        md += ["Where each start went, read from the server's own log (seconds; vLLM's log has one-second "
               "time stamps; `before vLLM's log` is the interpreter starting and importing vLLM; the cache "
               "column is whether torch.compile loaded its graphs):", "",
               tables.markdown(["cell", *[h for _, h in PHASE_COLS]],
                               [[p["cell_id"], *[p.get(k) if k == "compile_cache" and p.get(k) else
                                                 num(p.get(k), "{:.1f}") for k, _ in PHASE_COLS]]
                                for p in phases]), ""]
    return md


RULE = ("**slower** / **faster**: Holm-adjusted p < alpha and \\|ratio - 1\\| >= min effect; "
        "**equivalent**: Holm-adjusted TOST p < alpha (the 90 % interval inside +-min effect); "
        "**inconclusive**: neither (not \"no change\": the MDE says what the design could resolve); "
        "**insufficient replication**: fewer than 2 servers in an arm (nothing is decided).")


def verdict_section(s: dict[str, Any]) -> list[str]:
    f = s["run"]
    md = ["## Verdicts (each arm against the reference, pooled over passes: a server is one replicate)", ""]
    pooled = [c for c in s["comparisons"] if c["scope"] == "pooled"]
    if not pooled:
        return md + ["Only one arm: nothing to compare.", ""]
    target = f.get("target_mde_pct")
    md += [f"{RULE} Alpha {f['alpha']:g}, min effect {f['min_effect_pct']:g} %. Correction: "
           f"{s.get('correction') or 'none'}. Model: {pooled[0]['model']}.", "",
           tables.markdown(
               ["arm / ref", "depth", "servers", "ratio", "95 % CI", "diff ms/tok (CI)", "df", "p (Holm)",
                "TOST p (Holm)", "MDE %", f"servers for MDE <= {num(target, '{:g}')} %", "verdict"],
               [[f"{c['arm']} / {c['reference']}", str(c["depth"]), f"{c['n_arm']} + {c['n_ref']}",
                 num(c["ratio"], "{:.3f}"),
                 interval(c["ratio_ci_lo"], c["ratio_ci_hi"], "{:.3f}")
                 + ("" if c.get("ci_kind") in (None, "between-server") else f" ({c['ci_kind']})"),
                 f"{num(c['diff_ms'], '{:+.2f}')} ({num(c['diff_ci_lo_ms'], '{:+.2f}')}..{num(c['diff_ci_hi_ms'], '{:+.2f}')})",
                 num(c.get("df"), "{:.1f}"), num(c.get("p_adjusted"), "{:.3g}"), num(c.get("p_equiv_adjusted"), "{:.3g}"),
                 num(c.get("mde_pct"), "{:.1f}"), _servers(c), f"**{c['decision']}**"] for c in pooled]), ""]
    mdes = [c["mde_pct"] for c in pooled if c.get("mde_pct") is not None]
    hws = [c["ci_half_width_pct"] for c in pooled if c.get("ci_half_width_pct") is not None and c.get("p_value") is not None]
    if mdes:
        md += [f"What this design could resolve: the decision rule calls changes of {min(mdes):.1f} to "
               f"{max(mdes):.1f} % and more with 80 % power (MDE: at the family's strictest step, alpha "
               f"{pooled[0].get('alpha_step') or f['alpha']:.3g}, and with the {f['min_effect_pct']:g} % min-effect "
               f"condition, so never below it); 95 % intervals within +-{min(hws):.2f} to +-{max(hws):.2f} %. "
               f"\"Servers for MDE <= {num(target, '{:g}')} %\": servers per arm, at this run's rounds, whose MDE "
               "would be at most that (from the same model and rule).", ""]
    vmod = s.get("variance_model")
    if vmod:
        md += [f"Variance model: {vmod['components']} ({vmod['method']}) over {vmod['n_cells']} cells on "
               f"{vmod['n_servers']} servers: server sd {100 * vmod['sd_server']:.3f} %, cell excess sd "
               f"{100 * vmod['sd_cell_excess']:.3f} %; per-value noise pooled per arm and depth (summary.json: "
               "`variance_model`).", ""]
    per_pass = [c for c in s["comparisons"] if c["scope"] == "pass"]
    if per_pass:
        md += ["Per pass (two servers only: the interval leaves out between-server variance, so no verdict "
               "is drawn from it):", "",
               tables.markdown(["arm / ref", "depth", "pass", "ratio", "95 % CI (within-server)"],
                               [[f"{c['arm']} / {c['reference']}", str(c["depth"]), str(c["pass"]),
                                 num(c["ratio"], "{:.3f}"), interval(c["ratio_ci_lo"], c["ratio_ci_hi"], "{:.3f}")]
                                for c in per_pass]), ""]
    return md


def _servers(c: dict[str, Any]) -> str:
    if c.get("p_value") is None:
        return "-"
    n = c.get("servers_needed")
    return str(n) if n is not None else f"> 64"


def _gpu_time(g: dict[str, Any] | None) -> str:
    if not g:
        return "-"
    wall = f"{g['wall_minutes']:.1f} min wall clock (manifest start to end); " if g.get("wall_minutes") else ""
    return (wall + f"cells {g['cells_minutes']:.1f} min: starts {g['starts_minutes']:.1f}, warm-up "
            f"{g['warmup_minutes']:.1f}, timed rounds {g['measure_minutes']:.1f}")


def _replication(r: dict[str, Any] | None, passes: int) -> str:
    if not r:
        return f"{passes} pass(es) as planned (one server per arm and pass)"
    if not str(r.get("rule", "")).startswith("two-stage"):   # a run from before the two-stage rule
        return (f"adaptive (one pass at a time, until the interval was narrow): {r.get('passes')} passes, "
                f"stopped by **{r.get('stopped_by')}**")
    head = (f"adaptive, two stages (target +-{r['target_ci_pct']:g} %): {r['pilot_passes']} pilot pass(es) "
            f"(widest +-{num(r.get('pilot_widest_ci_half_width_pct'), '{:.2f}')} %), then ")
    if not r.get("extra_passes"):
        return head + f"none: **{r['stopped_by']}**" + (f" ({r['limit']})" if r.get("limit") else "")
    al = r.get("allocation") or {}
    rounds = ", ".join(f"{d}: {n}" for d, n in (r.get("rounds") or {}).items())
    got = r.get("widest_ci_half_width_pct")
    return (head + f"**{r['extra_passes']} more pass(es)** with rounds per depth {rounds}, chosen from the "
            f"pilot's variance model and costs ({r['stopped_by']}; {r.get('limit')}; predicted "
            f"{num(al.get('predicted_gpu_minutes'), '{:.1f}')} GPU-min); achieved widest +-"
            f"{num(got, '{:.2f}')} % (" + ("target met" if r.get("target_met") else "**target not met**") + ")")
