"""Rounds at c > 1 that the stall check refuses (e2e/stats/stall.py), applied when a run folder is
read: a run measured before the check (results/h200-load-tp1) counted such rounds, and a report must
not decide on them. The runner refuses them as it measures (e2e/run/batch.round_problem), so in a run
measured since, nothing is left here to drop."""

from __future__ import annotations

import statistics
from typing import Any

from e2e.design.point import Point
from e2e.stats import stall


def refuse_stalled(
    by_cell: dict[str, list[dict[str, Any]]], lengths: tuple[int, int], min_effect_pct: float
) -> tuple[dict[str, list[dict[str, Any]]], set[str], list[str]]:
    """The counted rows without the stalled rounds (over the line of the run's lengths and min effect),
    the cells left with no round of one of `lengths` (they give no estimate), and one warning per cell
    that lost any."""
    line = stall.line_steps(*lengths, min_effect_pct)
    kept: dict[str, list[dict[str, Any]]] = {}
    unusable: set[str] = set()
    warnings = []
    for cid, rows in by_cell.items():
        bad = [
            i for i, r in enumerate(rows) if Point.of(r).concurrency > 1 and stall.stall_problem(r, r["n_tokens"], line)
        ]
        if not bad:
            kept[cid] = rows
            continue
        kept[cid] = [r for i, r in enumerate(rows) if i not in set(bad)]
        gaps = [1e3 * g for i in bad if (g := stall.unexplained_s(rows[i])) is not None]
        sizes = ", ".join(str(n) for n in sorted({rows[i]["n_tokens"] for i in bad}))
        why = (
            f"{cid}: {len(bad)} round(s) of {sizes} tokens refused: the server held the answers a median "
            f"{statistics.median(gaps):.0f} ms past TTFT + decode (e2e/stats/stall.py)"
        )
        if any(all(r["n_tokens"] != n for r in kept[cid]) for n in lengths):
            unusable.add(cid)
            why += "; no round of that length is left, so the cell is left out (re-time it with a longer short length)"
        warnings.append(why)
    return kept, unusable, warnings
