"""report.md: a run's summary (e2e/report/summary.py) as markdown, section by section, from the summary
alone (so report.md can be re-rendered from summary.json); the gsm8k sign-off's section too, for
gsm8k.md. Every number comes from the summary; nothing here computes a statistic. Each table is
rendered from its declaration in e2e/report/summary.py; the decision rule's words from e2e/stats/outcomes.py."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from e2e.exits import MEANING
from e2e.report import figures
from e2e.report import summary as sm
from e2e.report.tables import markdown, num, render_markdown
from e2e.rundir.store import FINISHED
from e2e.stats import outcomes

Section = Callable[[dict[str, Any]], list[str]]


def markdown_report(s: dict[str, Any]) -> str:
    """report.md of a summary (summary.json as read back). A folder without latency cells (the
    stand-alone gsm8k sign-off's) gets the head, its facts and the sign-off only."""
    md: list[str] = []
    for section in SECTIONS if latency(s) else (head, facts, no_cells, gsm8k, warnings):
        md += section(s)
    return "\n".join(md)


def latency(s: dict[str, Any]) -> bool:
    return bool(s["cells"])


def no_cells(s: dict[str, Any]) -> list[str]:
    return [
        "## Latency",
        "",
        "No latency cells in this folder"
        + (" (made by `run_e2e.py gsm8k`)" if s["run"].get("command") == "gsm8k" else "")
        + ": nothing is measured or decided here but the "
        "sign-off below.",
        "",
    ]


# -- the head: what ran, and what a reader must know first ------------------------------------------
def head(s: dict[str, Any]) -> list[str]:
    f = s["run"]
    md = [
        f"# {f['run_id']}: {'decode latency' if latency(s) else 'gsm8k sign-off'} report",
        "",
        f"<!-- schema_version {s['schema_version']}; recomputed from the rows by `run_e2e.py report` -->",
        "",
    ]
    if f["twin_of"]:
        md += [
            f"> **WARNING: RANDOM-WEIGHT TWIN.** The model served is `{f['model']}`, a random-weight "
            f"twin of `{f['twin_of']}`: same shapes and format, NOT the real model. Latency only; "
            "no accuracy figure here means anything.",
            "",
        ]
    if not f["code"]["identified"]:
        md += [
            f"> **WARNING: CODE NOT IDENTIFIED.** {f['code']['line']}. These numbers cannot be tied to a "
            "version of this project.",
            "",
        ]
    if f["status"] not in FINISHED:
        md += [
            f"> **WARNING: RUN NOT FINISHED: status `{f['status']}`**"
            + (f" ({f['error']})" if f.get("error") else "")
            + (
                ": the manifest was never finalised (the run was cut off or copied while running)"
                if f["status"] == "running"
                else ""
            )
            + ". What is below is what its rows hold.",
            "",
        ]
    return md


def facts(s: dict[str, Any]) -> list[str]:
    f = s["run"]
    rows = [
        ["vLLM", f["vllm"] or "unknown"],
        ["GPU", f["gpu"] or "none recorded (CPU?)"],
        ["model", f"`{f['model']}`" + (f" (twin of `{f['twin_of']}`)" if f["twin_of"] else "")],
        ["tensor parallel", str(f["tp"])],
        ["graph mode", f["graph_mode"]],
    ]
    if latency(s):
        rows += _latency_facts(s)
    rows += [
        [
            "run status",
            f"{f['status']} ({f['started']} to {f['ended']})"
            + (f"; {f['status_note']}" if f.get("status_note") else ""),
        ],
        [
            "exit status",
            "not recorded (the run predates it)"
            if f.get("exit_status") is None
            else f"{f['exit_status']}: {MEANING.get(f['exit_status'], '?')}",
        ],
        ["code", f["code"]["line"]],
    ]
    if f.get("harness_flag_overrides") is not None:
        used = f["harness_flag_overrides"]
        rows.append(
            [
                "harness flag overrides",
                "**allowed** (server.allow_harness_flag_overrides): "
                + ("; ".join(f"`{u}`" for u in used) if used else "none used"),
            ]
        )
    return [markdown(["", ""], rows), ""]


def _latency_facts(s: dict[str, Any]) -> list[list[str]]:
    f = s["run"]
    return [
        ["server mode", str(f["server_mode"])],
        ["order / passes", f"{f['order']} / {len(f['passes'])}"],
        ["arms (reference first)", ", ".join(f["arms"])],
        [
            "estimate",
            f"{f['estimator_definition']}, {f['rounds']} rounds"
            + (f", target CI {f['target_ci_pct']} %" if f["target_ci_pct"] else ""),
        ],
        [
            "estimator",
            f"**{f['estimator']}**: {f['estimator_note']}; the plain client estimate is in every "
            "cell row as the check (Cells: `client ms/tok`)",
        ],
        [
            "decision rule",
            f"alpha {f['alpha']:g} (family-wise, Holm), min effect {f['min_effect_pct']:g} %: see Verdicts",
        ],
        ["replication", _replication(f.get("replication"), len(f["passes"]))],
        ["executor", executor_line(s["executor"])],
        ["GPU time", _gpu_time(f.get("gpu_time"))],
    ]


def executor_line(c: dict[str, Any]) -> str:
    """How the cells ran: which executor(s), on how many slots, how many at once."""
    kinds = " then ".join(dict.fromkeys(c["executors"]))
    if "ray" not in c["executors"]:
        return f"{kinds}: one cell at a time on this host"
    return (
        f"{kinds} (Ray: {c['ray_address']}): {c['n_slots']} slot(s) on {c['hosts']} host(s); at most "
        f"**{c['max_at_once_per_host']} cell(s) at once per host** (cap {c['max_per_host_cap']}), "
        f"{c['max_at_once']} at once in all"
    )


def _gpu_time(g: dict[str, Any] | None) -> str:
    if not g:
        return "-"
    wall = ""
    if g.get("wall_minutes") and (g.get("harness_sessions") or 1) > 1:
        wall = (
            f"{g['wall_minutes']:.1f} min wall clock in {g['harness_sessions']} harness sessions (each "
            f"from its start to its last cell row, the last to the run's end; "
            f"{g['wall_not_counted_minutes']:.1f} min between them not counted); "
        )
    elif g.get("wall_minutes"):
        wall = f"{g['wall_minutes']:.1f} min wall clock (manifest start to end); "
    return (
        wall + f"cells {g['cells_minutes']:.1f} min: starts {g['starts_minutes']:.1f}, warm-up "
        f"{g['warmup_minutes']:.1f}, timed rounds {g['measure_minutes']:.1f}"
    )


def _replication(r: dict[str, Any] | None, passes: int) -> str:
    if not r:
        return f"{passes} pass(es) as planned (one server per arm and pass)"
    if not str(r.get("rule", "")).startswith("two-stage"):  # a run from before the two-stage rule
        return (
            f"adaptive (one pass at a time, until the interval was narrow): {r.get('passes')} passes, "
            f"stopped by **{r.get('stopped_by')}**"
        )
    head = (
        f"adaptive, two stages (target +-{r['target_ci_pct']:g} %): {r['pilot_passes']} pilot pass(es) "
        f"(widest +-{num(r.get('pilot_widest_ci_half_width_pct'), '{:.2f}')} %), then "
    )
    if not r.get("extra_passes"):
        return head + f"none: **{r['stopped_by']}**" + (f" ({r['limit']})" if r.get("limit") else "")
    al = r.get("allocation") or {}
    rounds = ", ".join(f"{d}: {n}" for d, n in (r.get("rounds") or {}).items())
    got = r.get("widest_ci_half_width_pct")
    return (
        head + f"**{r['extra_passes']} more pass(es)** with rounds per depth {rounds}, chosen from the "
        f"pilot's variance model and costs ({r['stopped_by']}; {r.get('limit')}; predicted "
        f"{num(al.get('predicted_gpu_minutes'), '{:.1f}')} GPU-min); achieved widest +-"
        f"{num(got, '{:.2f}')} % (" + ("target met" if r.get("target_met") else "**target not met**") + ")"
    )


# -- verdicts -------------------------------------------------------------------------------------
def verdicts(s: dict[str, Any]) -> list[str]:
    f = s["run"]
    md = ["## Verdicts (each arm against the reference; a server is one replicate)", ""]
    pooled = [c for c in s["comparisons"] if c["scope"] == "pooled"]
    if not pooled:
        return md + ["Only one arm: nothing to compare (and no ratio figure).", ""]
    target = f.get("target_mde_pct")
    md += [
        f"{outcomes.rule_text()} Alpha {f['alpha']:g}, min effect {f['min_effect_pct']:g} %. Correction: "
        f"{s.get('correction') or 'none'}. Model: {pooled[0]['model']}.",
        "",
        render_markdown(sm.COMPARISONS, pooled, target=num(target, "{:g}")),
        "",
    ]
    mdes = [c["mde_pct"] for c in pooled if c.get("mde_pct") is not None]
    hws = [
        c["ci_half_width_pct"]
        for c in pooled
        if c.get("ci_half_width_pct") is not None and c.get("p_value") is not None
    ]
    if mdes:
        md += [
            f"What this design could resolve: the decision rule calls changes of {min(mdes):.1f} to "
            f"{max(mdes):.1f} % and more with 80 % power (MDE: at the family's strictest step, alpha "
            f"{pooled[0].get('alpha_step') or f['alpha']:.3g}, and with the {f['min_effect_pct']:g} % min-effect "
            f"condition, so never below it); 95 % intervals within +-{min(hws):.2f} to +-{max(hws):.2f} %. "
            f'"Servers for MDE <= {num(target, "{:g}")} %": servers per arm, at this run\'s rounds, whose MDE '
            "would be at most that (from the same model and rule).",
            "",
        ]
    vmod = s.get("variance_model")
    if vmod:
        md += [
            f"Variance model: {vmod['components']} ({vmod['method']}) over {vmod['n_cells']} cells on "
            f"{vmod['n_servers']} servers: server sd {100 * vmod['sd_server']:.3f} %, cell excess sd "
            f"{100 * vmod['sd_cell_excess']:.3f} %; per-value noise pooled per arm and depth (summary.json: "
            "`variance_model`).",
            "",
        ]
    per_pass = [c for c in s["comparisons"] if c["scope"] == "pass"]
    if per_pass:
        md += [
            "Per pass (two servers only: the interval leaves out between-server variance, so no verdict "
            "is drawn from it):",
            "",
            render_markdown(sm.COMPARISONS, per_pass, "pass"),
            "",
        ]
    if figures.RATIO in figures.drawn(s):
        md += [f"![arm ratio per depth]({figures.RATIO}) {figures.ratio_caption(s)}", ""]
    return md


# -- cells and their agreement ----------------------------------------------------------------------
def cells(s: dict[str, Any]) -> list[str]:
    md = ["## Cells", "", render_markdown(sm.CELLS, s["cells"]), ""]
    if figures.DECODE in figures.drawn(s):
        md += [f"![decode ms/token vs depth]({figures.DECODE}) {figures.decode_caption(s)}", ""]
    return md


def agreement(s: dict[str, Any]) -> list[str]:
    md = ["## Pass agreement (same arm, same depth, across passes)", ""]
    ag = [x for x in s["pass_agreement"] if x["max_rel_diff_pct"] is not None]
    if not ag:
        return md + ["One pass only: no agreement to report.", ""]
    return md + [f"At most {s['max_pass_disagreement_pct']:.1f} % apart.", "", render_markdown(sm.AGREEMENT, ag), ""]


def slots(s: dict[str, Any]) -> list[str]:
    """Only for runs where some cells ran on Ray slots: cells per slot and the slot effect."""
    sl, c, alpha = s.get("slots"), s["executor"], s["run"]["alpha"]
    per = (sl or {}).get("per_slot") or {}
    if not per:
        return []
    p = sl.get("p_value")
    return [
        "## Slots (where the cells ran: a blocking factor)",
        "",
        f"{executor_line(c)}. Arms over the slots as run: "
        + ("**balanced**" if sl.get("balanced_as_run") else "**not balanced** (see Warnings)")
        + f". Slot effect ({sl['test']}): "
        + (
            f"p = {p:.3g}" + (" **(slots differ)**" if p < alpha else "")
            if p is not None
            else "not testable (one slot, or too few cells)"
        )
        + ".",
        "",
        render_markdown(sm.SLOTS, [{"slot": k, **v} for k, v in per.items()]),
        "",
    ]


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


# -- gsm8k --------------------------------------------------------------------------------------------
def gsm8k(s: dict[str, Any]) -> list[str]:
    gs = s.get("gsm8k") or []
    if not gs:
        return []
    md = ["## GSM8K", ""]
    for g in gs:
        md += gsm8k_markdown(
            g["content"], link_prefix=g["file"].rsplit("/", 1)[0] + "/", title=f"Sign-off (`{g['file']}`)", level=3
        )
    return md


def gsm8k_markdown(g: Any, link_prefix: str = "", title: str = "gsm8k sign-off", level: int = 2) -> list[str]:
    """A gsm8k sign-off summary (gsm8k/summary.json) as tables; links relative to link_prefix."""
    h = "#" * level
    if not isinstance(g, dict) or "units" not in g:
        why = g.get("error") if isinstance(g, dict) and g.get("error") else "not a sign-off summary this harness knows"
        return [f"{h} {title}", "", f"Unreadable: {why}.", ""]
    st = g.get("settings") or {}
    alpha, margin = st.get("alpha"), st.get("max_accuracy_drop")
    md = [
        f"{h} {title}",
        "",
        f"**Verdict: {g['verdict']}** - model `{g['model']}`, {g['questions']} questions, "
        f"tasks {', '.join(g['tasks'])}, baseline arm `{g['baseline_arm']}`"
        + (f", A/A on `{g['aa_arm']}`" if g.get("aa_arm") else "")
        + ".",
    ]
    old_rule = any("n" in c and "drop_upper" not in c for c in g.get("comparisons") or [])
    if old_rule:
        md.append(
            "These comparisons carry no drop bounds: the summary was written under the earlier sign-off "
            "rule (pass: McNemar did not reject), and its verdicts are shown as written."
        )
    elif alpha is not None and margin is not None:
        md.append(
            f"Pass means non-inferiority: the one-sided {100 * (1 - alpha):g} % upper bound of the paired "
            f"accuracy drop is at most {100 * margin:.1f} points, on the primary filter of each task, for "
            "every arm against the baseline; fail: the lower bound is above it; inconclusive: neither "
            "(McNemar is reported, it does not decide)."
        )
    md.append("")
    md += [f"- warning: {w}" for w in g.get("warnings") or []]
    if g.get("warnings"):
        md.append("")
    md += [
        render_markdown(sm.gsm8k_servers(g["tasks"], g.get("primary_filter") or {}, link_prefix), g["units"]),
        "",
        render_markdown(sm.GSM8K_COMPARISONS, g.get("comparisons") or []),
        "",
    ]
    reasons = [
        (c, r)
        for c in g.get("comparisons") or []
        if c.get("primary")
        for r in c.get("reasons", []) + c.get("notes", [])
    ]
    if reasons:
        md += (
            ["Reasons:"]
            + [f"- {c['kind'].upper()} {c['a_server']} vs {c['b_server']} ({c['task']}): {r}" for c, r in reasons]
            + [""]
        )
    if g.get("definitions"):
        md += ["Definitions: " + "; ".join(f"*{k}*: {v}" for k, v in g["definitions"].items()) + ".", ""]
    md += [f"Numbers: [summary.json]({link_prefix}summary.json); task files as run: [tasks/]({link_prefix}tasks/).", ""]
    return md


def warnings(s: dict[str, Any]) -> list[str]:
    md = [f"## Warnings ({len(s['warnings'])})", ""]
    md += [f"- {w}" for w in s["warnings"]] or ["None."]
    return md + [""]


SECTIONS: list[Section] = [
    head,
    facts,
    verdicts,
    cells,
    agreement,
    slots,
    gpu_state,
    floor,
    starts,
    routing,
    gsm8k,
    warnings,
]


def as_json(s: dict[str, Any]) -> dict[str, Any]:
    """The summary as summary.json holds it (keys strings, tuples lists): what report.md is rendered from."""
    return json.loads(json.dumps(s, default=str))
