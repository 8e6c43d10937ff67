"""Where a run's GPU time went: the finished cells' starts, warm-ups and timed rounds, and the wall
clock of the harness sessions (a resumed run has several)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any


def gpu_time(manifest: dict[str, Any], cell_rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """From the rows: server starts, warm-ups and timed rounds of the finished cells (the counted
    attempts; a failed start's time is in the wall clock only), and the wall clock of the harness
    sessions (wall_clock_sessions)."""
    all_rows = list(cell_rows)
    rows = [c for c in all_rows if c.get("status") == "ok"]
    parts = {k: sum(float(c.get(k) or 0.0) for c in rows) for k in ("startup_s", "warmup_s", "measure_s")}
    wall, n, gap = wall_clock_sessions(manifest, all_rows)
    return {
        "cells_minutes": sum(parts.values()) / 60,
        "starts_minutes": parts["startup_s"] / 60,
        "warmup_minutes": parts["warmup_s"] / 60,
        "measure_minutes": parts["measure_s"] / 60,
        "wall_minutes": None if wall is None else wall / 60,
        "harness_sessions": n,
        "wall_not_counted_minutes": None if gap is None else gap / 60,
    }


def _when(v: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(v) if isinstance(v, str) else None
    except ValueError:
        return None


def wall_clock_sessions(
    manifest: dict[str, Any], cell_rows: Iterable[dict[str, Any]]
) -> tuple[float | None, int, float | None]:
    """(seconds, sessions, seconds not counted): the wall clock the harness ran, over its sessions.

    A resumed run has one session per harness: the first from the manifest's start, each resume
    from its own start. A session that a later resume followed ended unseen (the harness died), so it
    counts to its last cell row; the last counts to the manifest's end. The time between a dead
    harness and its resume (hours, across machines) is no GPU time of this run and is returned apart.
    """
    t0, t1 = _when(manifest.get("started")), _when(manifest.get("ended"))
    if t0 is None or t1 is None:
        return None, 1, None
    starts = [t0] + [
        t for r in manifest.get("resumes") or [] if isinstance(r, dict) and (t := _when(r.get("started"))) is not None
    ]
    starts.sort()
    finished = [t for c in cell_rows if (t := _when(c.get("finished"))) is not None]
    total = 0.0
    for i, s in enumerate(starts):
        if i + 1 < len(starts):
            e = max([t for t in finished if s <= t < starts[i + 1]], default=s)
        else:
            e = t1
        total += max((e - s).total_seconds(), 0.0)
    return total, len(starts), (t1 - t0).total_seconds() - total
