"""The answer on the console, from a run's summary (summary.json) alone: the cells, the verdict table
(arm, depth, ratio and interval, verdict, MDE) and the gsm8k sign-off. A run ends with it
(e2e/run/session.py, then its exit status); `run_e2e.py report RUN` prints it again. Names in it
(run ids, arms, cells, warnings) are data: never read as rich markup."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.markup import escape

from e2e import exits
from e2e.report import summary as sm
from e2e.report.progress import say
from e2e.report.tables import render_console


def say_tables(console: Any, s: dict[str, Any], cells: bool = True) -> None:
    """The cells, the verdicts (pooled: each arm against the reference) and the sign-off. cells=False:
    the cells only where there is no verdict to show (one arm), else a line counting them."""
    pooled = [c for c in s["comparisons"] if c["scope"] == "pooled"]
    if not s["cells"]:
        say(console, f"{s['run']['run_id']}: no latency cells (a sign-off only)")
    elif cells or not pooled:
        console.print(render_console(sm.CELLS, s["cells"], title=escape(f"{s['run']['run_id']}: cells")))
    else:
        ok = sum(c["status"] == "ok" for c in s["cells"])
        say(console, f"{s['run']['run_id']}: {ok} of {len(s['cells'])} cells ok (each in report.md)")
    if pooled:
        console.print(
            render_console(
                sm.COMPARISONS,
                pooled,
                title=escape(
                    f"verdicts (each arm against {s['run']['reference_arm']}; Holm, min effect "
                    f"{s['run']['min_effect_pct']:g} %)"
                ),
            )
        )
    elif s["cells"]:
        say(console, "verdicts: one arm only, nothing to compare")
    for g in s.get("gsm8k") or []:
        c = g["content"]
        if isinstance(c, dict) and "units" in c:
            primary = [x for x in c.get("comparisons") or [] if x.get("primary")]
            title = f"gsm8k sign-off: {c['verdict']} ({c['questions']} questions)"
            console.print(render_console(sm.GSM8K_COMPARISONS, primary, title=escape(title)))
            for w in c.get("warnings") or []:
                say(console, f"gsm8k: {w}")


def say_the_answer(console: Any, root: Path, status: int, s: dict[str, Any] | None) -> None:
    """A run's last word: its tables, where the report is and what its exit status means (no
    summary: the exit status alone)."""
    if s is None:
        say(console, f"no summary.json in {root}; exit status {status}: {exits.MEANING[status]}")
        return
    say_tables(console, s)
    say(console, f"report: {root / 'report.md'}")
    say(console, f"exit status {status}: {exits.MEANING[status]}")
