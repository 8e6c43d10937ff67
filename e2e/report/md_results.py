"""report.md's results: the verdicts, the cells, the passes' agreement and the slots the cells ran on."""

from __future__ import annotations

from typing import Any

from e2e.design.point import Point
from e2e.report import figures, md_load
from e2e.report import summary as sm
from e2e.report.md_facts import executor_line
from e2e.report.tables import num, render_markdown
from e2e.stats import outcomes
from e2e.stats.variance_model import BATCH, PER_POINT, PROPORTIONAL
from e2e.stats.verdicts import INERT


# -- verdicts -------------------------------------------------------------------------------------
def verdicts(s: dict[str, Any]) -> list[str]:
    f = s["run"]
    md = ["## Verdicts (each arm against the reference; a server is one replicate)", ""]
    pooled = [c for c in s["comparisons"] if c["scope"] == "pooled"]
    if not pooled:
        return md + ["Only one arm: nothing to compare (and no ratio figure).", ""]
    target = f.get("target_mde_pct")
    inert = [c for c in pooled if c.get("decision") == INERT]
    md += [
        f"{outcomes.rule_text(c['decision'] for c in pooled)} Alpha {f['alpha']:g}, min effect {f['min_effect_pct']:g} %. Correction: "
        f"{s.get('correction') or 'none'}. Model: {pooled[0]['model']}.",
        "",
    ]
    if inert:
        md += _inert(inert)
    cs = md_load.concurrencies(s)
    for c in cs:  # a table per concurrency in a grid run; one table otherwise
        title = [f"### c = {c} ({c} request{'s' if c > 1 else ''} decoding together)", ""] if len(cs) > 1 else []
        md += title + [render_markdown(sm.COMPARISONS, md_load.per_c(pooled, c), target=num(target, "{:g}")), ""]
    md += _resolution(f, pooled, target)
    vmod = s.get("variance_model")
    if vmod:
        md += [
            f"Variance model: {vmod['components']} ({vmod['method']}) over {vmod['n_cells']} cells on "
            f"{vmod['n_servers']} servers: server sd {100 * vmod['sd_server']:.3f} %, cell excess sd "
            f"{_excess(vmod)}; per-value noise pooled per arm and depth (summary.json: `variance_model`).",
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


def _inert(inert: list[dict[str, Any]]) -> list[str]:
    """What was seen, per arm and point, where a patch changed nothing (the numbers alone would have
    read decision_measured)."""
    return [
        "Inert (the arm's patch changed nothing there; e2e/rundir/patch_evidence.py):",
        "",
        *(
            f"- {c['arm']} at {Point.of(c)}: "
            + "; ".join(
                f"`{x['function'].split(':')[1]}` ({x['function'].split(':')[0]}) {x['seen']}" for x in c["inert"]
            )
            + f" (the numbers alone: {c.get('decision_measured') or 'no decision'})"
            for c in inert
        ),
        "",
    ]


def _resolution(f: dict[str, Any], pooled: list[dict[str, Any]], target: Any) -> list[str]:
    """What the design could resolve: the MDEs and interval half-widths over the pooled comparisons
    (nothing where no comparison has an MDE)."""
    mdes = [c["mde_pct"] for c in pooled if c.get("mde_pct") is not None]
    hws = [
        c["ci_half_width_pct"]
        for c in pooled
        if c.get("ci_half_width_pct") is not None and c.get("p_value") is not None
    ]
    if not mdes:
        return []
    return [
        f"What this design could resolve: the decision rule calls changes of {min(mdes):.1f} to "
        f"{max(mdes):.1f} % and more with 80 % power (MDE: at the family's strictest step, alpha "
        f"{pooled[0].get('alpha_step') or f['alpha']:.3g}, and with the {f['min_effect_pct']:g} % min-effect "
        f"condition, so never below it); 95 % intervals within +-{min(hws):.2f} to +-{max(hws):.2f} %. "
        f'"Servers for MDE <= {num(target, "{:g}")} %": servers per arm, at this run\'s rounds, whose MDE '
        "would be at most that (from the same model and rule).",
        "",
    ]


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
    """Only for runs whose executors recorded slots (summary.build): cells per slot and the slot effect."""
    sl, c, alpha = s.get("slots") or {}, s["executor"], s["run"]["alpha"]
    per = sl.get("per_slot") or {}
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


def _excess(vmod: dict[str, Any]) -> str:
    """The cell excess as the fit chose it: one for every point, growing with the point's noise, or
    one per point."""
    ce = vmod.get("cell_excess") or {}
    if ce.get("model") not in (PROPORTIONAL, PER_POINT, BATCH):
        one = f"{100 * vmod['sd_cell_excess']:.3f} %"
        return one + (
            " (one for every point: it fits at least as well as one growing with the noise)" if ce.get("rule") else ""
        )
    per = {str(Point.of(g)): g["sd_cell_excess"] for g in vmod["groups"] if "sd_cell_excess" in g}
    why = (
        f"one per point: {ce['rule']}"
        if ce.get("model") == PER_POINT
        else f"{ce['rule']}; at batch 1 {ce.get('batch_1') or 'no point'}"
        if ce.get("model") == BATCH
        else f"proportional to the point's noise: its REML likelihood exceeds one excess's by {ce['loglik_gain']:.2f} in log, AIC"
    )
    return ", ".join(f"{k} {100 * x:.3f} %" for k, x in per.items()) + f" ({why})"
