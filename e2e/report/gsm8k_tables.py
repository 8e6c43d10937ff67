"""The gsm8k sign-off's tables (e2e/accuracy/summary.py's summary): one row per server, one per
paired comparison. Rendered in gsm8k.md and report.md (e2e/report/md_gsm8k.py) and on the console at
a run's end; declared as columns (e2e/report/tables.py) like the run's own (e2e/report/summary.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from e2e.report.tables import BOTH, Col, Table, col, num, pct, text
from e2e.stats import outcomes


def _signoff_colour(r: dict[str, Any]) -> str | None:
    w = outcomes.signoff(r.get("verdict"))
    return w.colour if w else None


def gsm8k_servers(tasks: list[str], primary: dict[str, str], link_prefix: str = "") -> Table:
    """One row per server; a column per task (its primary filter's accuracy with interval)."""

    def acc(task: str) -> Callable[[dict[str, Any]], str]:
        def show(u: dict[str, Any]) -> str:
            b = (u.get("tasks") or {}).get(task, {}).get("accuracy", {}).get(primary.get(task))
            return "-" if b is None else f"{pct(b['accuracy'])} [{pct(b['ci_low'])}, {pct(b['ci_high'])}]"

        return show

    def links(u: dict[str, Any]) -> str:
        ts = u.get("tasks") or {}
        return (
            ", ".join(f"[{t}]({link_prefix}{ts[t]['questions']})" for t in tasks if t in ts and ts[t].get("questions"))
            or "-"
        )

    return Table(
        "gsm8k_servers",
        (
            col("dir", "server", None),
            col("status", "status", None, BOTH),
            col("startup_s", "start s"),
            col("eval_s", "eval s"),
            *[Col(f"{t} ({primary.get(t)}) % [CI]", acc(t), views=BOTH) for t in tasks],
            Col("per-question", links),
        ),
    )


def _paired(r: dict[str, Any], show: Any) -> str:
    return "-" if "n" not in r else show(r)


GSM8K_COMPARISONS = Table(
    "gsm8k_comparisons",
    (
        Col("comparison", lambda c: f"{c['kind'].upper()}: {c['a_server']} vs {c['b_server']}", views=BOTH),
        Col(
            "task / filter",
            lambda c: f"{c['task']} / {c['filter']}" + (" (primary)" if c.get("primary") else ""),
            views=BOTH,
        ),
        Col("n", lambda c: _paired(c, lambda c: str(c["n"]))),
        Col("A %", lambda c: _paired(c, lambda c: pct(c["a"]["accuracy"])), views=BOTH),
        Col("B %", lambda c: _paired(c, lambda c: pct(c["b"]["accuracy"])), views=BOTH),
        Col(
            "change pts [CI]",
            lambda c: _paired(
                c,
                lambda c: (
                    f"{100 * c['change']:+.1f} [{100 * c['change_ci_low']:+.1f}, {100 * c['change_ci_high']:+.1f}]"
                    if c.get("change_ci_low") is not None
                    else f"{100 * c['change']:+.1f}"
                ),
            ),
        ),
        Col("drop upper pts", lambda c: _paired(c, lambda c: pct(c.get("drop_upper"), "{:+.1f}")), views=BOTH),
        Col("A only", lambda c: _paired(c, lambda c: str(c["table"]["a_only"]))),
        Col("B only", lambda c: _paired(c, lambda c: str(c["table"]["b_only"]))),
        Col("McNemar p", lambda c: _paired(c, lambda c: num(c.get("mcnemar_p"), "{:.3g}"))),
        Col("text differ", lambda c: _paired(c, _text_differ)),
        Col("verdict", lambda c: text(c.get("verdict")), views=BOTH, colour=_signoff_colour),
    ),
)


def _text_differ(c: dict[str, Any]) -> str:
    td = str(c.get("text_differ", "-"))
    if "aa_baseline" in c:
        ex = c["aa_baseline"].get("excess", {}).get("text_differ", {})
        td += f" (A/A {c['aa_baseline']['text_differ']}" + (", **more**" if ex.get("flagged") else "") + ")"
    return td
