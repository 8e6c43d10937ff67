"""The run's one estimator (e2e/stats/estimate.py), why it was chosen, and the bookends tested under it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from e2e.stats import bookends, estimate
from e2e.stats import cells as stats


def choose_estimator(
    setting: str, ok: Iterable[str], by_cell: dict[str, list[dict[str, Any]]], n_long: int, n_short: int
) -> tuple[str, str, str | None]:
    """(estimator, why, warning or None). The prefill-corrected estimate when the setting allows it,
    every counted valid row of the finished cells `ok` has the server's prefill time and every cell's
    corrected estimate agrees with its plain client one (stats.AGREE_PCT, AGREE_SD); else the plain
    client estimate, with a warning naming the cells."""
    if setting == estimate.CLIENT:
        return estimate.CLIENT, 'the plain client estimate (stats.estimator = "client")', None
    missing, disagree = [], []
    for cid in ok:
        rows = by_cell.get(cid, [])
        if any(r.get("valid") and r.get("server_prefill_s") is None for r in rows):
            missing.append(cid)
            continue
        cs = stats.cell_stats(rows, n_long, n_short, estimator=estimate.CORRECTED)
        if cs.client_agrees is False:
            disagree.append(f"{cid} ({100 * (cs.client_gap or 0.0):+.1f} %)")
    if not missing and not disagree:
        return (
            estimate.CORRECTED,
            "client wall time minus the server's own prefill time, every cell checked against the plain client estimate",
            None,
        )
    why = []
    if missing:
        why.append(f"no server prefill time in {len(missing)} cell(s): {', '.join(missing[:4])}")
    if disagree:
        why.append(f"the corrected and the plain client estimate disagree in {', '.join(disagree[:4])}")
    return (
        estimate.CLIENT,
        "the plain client estimate (fallback: " + "; ".join(why) + ")",
        "estimator: fell back to the plain client estimate: " + "; ".join(why),
    )


def bookends_under(
    cell_rows: dict[str, dict[str, Any]], requests: list[dict[str, Any]], estimator: str, n_long: int, n_short: int
) -> dict[str, dict[str, Any]]:
    """The cell rows with each bookend tested under the estimator that decided the run
    (bookends.retest): a server's drift is judged on the values its cells were estimated with."""
    out = {}
    for cid, row in cell_rows.items():
        b = row.get("bookend")
        out[cid] = {**row, "bookend": bookends.retest(b, requests, estimator, n_long, n_short)} if b else row
    return out
