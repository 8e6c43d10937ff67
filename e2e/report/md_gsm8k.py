"""The gsm8k sign-off as markdown: its section of report.md, and gsm8k.md (e2e/accuracy/gsm8k_step.py)."""

from __future__ import annotations

from typing import Any

from e2e.report.gsm8k_tables import GSM8K_COMPARISONS, gsm8k_servers
from e2e.report.tables import render_markdown


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
        render_markdown(gsm8k_servers(g["tasks"], g.get("primary_filter") or {}, link_prefix), g["units"]),
        "",
        render_markdown(GSM8K_COMPARISONS, g.get("comparisons") or []),
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
