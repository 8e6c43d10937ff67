"""report.md's head and facts table: what ran, how, and what a reader must know first (a twin, a run not
finished; code that cannot be identified, in one line); the one-line accounts of the executors, GPU
time and replication."""

from __future__ import annotations

from typing import Any

from e2e.exits import MEANING
from e2e.report.tables import markdown, num
from e2e.rundir.store import FINISHED


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
    if not f["code"]["identified"]:  # said in one line, not a banner: the numbers stand, their code is unknown
        md += [f"Code: {f['code']['line']}.", ""]
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
        ["run status", f"{f['status']} ({run_span(f)})" + (f"; {f['status_note']}" if f.get("status_note") else "")],
        [
            "exit status",
            "none: the harness died before it could exit (`run --resume` finishes the run)"
            if f.get("exit_status") is None and f.get("status") == "harness-died"
            else "not recorded (the run predates it)"
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
    batch = []
    if f.get("concurrency"):
        batch = [
            [
                "batch",
                f"**c = {', '.join(map(str, f['concurrency']))} requests decoding together** ({f['route']} route "
                "at every point: the "
                "server caches prefixes, each cell's prompts are prefilled once and reused, and a round counts "
                "only if its engine steps, prefix-cache hits and preemptions show the requests decoded together; "
                "each estimate is one decode step at its point's batch)",
            ]
        ]
    return batch + [
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
    if not c.get("n_slots"):  # no executor recorded slots: every cell ran in the harness's process
        return f"{kinds}: one cell at a time on this host"
    where = f" (address {c['ray_address']})" if c.get("ray_address") else ""
    return (
        f"{kinds}{where}: {c['n_slots']} slot(s) on {c['hosts']} host(s); at most "
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


def run_span(f: dict[str, Any]) -> str:
    """When the run ran: start to end, or its start alone where no end was recorded (the harness died)."""
    return f"{f['started']} to {f['ended']}" if f.get("ended") else f"started {f['started']}, no end recorded"
