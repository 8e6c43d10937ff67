"""A report states exactly what was tested: a figure's caption names the points it draws without an
interval, every server without a bookend is listed, and a bookend tests the estimator that decided."""

from __future__ import annotations

from typing import Any

from e2e.report import figures, report_gpu
from e2e.stats import bookends


def _summary(cells: list[dict[str, Any]]) -> dict[str, Any]:
    return {"cells": cells, "comparisons": [], "run": {"min_effect_pct": 1.0}}


def _cell(cid: str, ci: bool) -> dict[str, Any]:
    lo, hi = (9.9, 10.1) if ci else (None, None)
    return {"cell_id": cid, "arm": "a", "pass": 1, "depth": 1024, "estimate_ms": 10.0, "ci_lo_ms": lo, "ci_hi_ms": hi}


def test_the_decode_caption_names_the_points_drawn_without_an_interval():
    some = figures.decode_caption(_summary([_cell("p1-d1024-a", True), _cell("p3-d1024-a", False)]))
    assert "except 1 cell(s) with none" in some and some.endswith(
        "p3-d1024-a; no lines: every cell had its own server."
    )
    assert "p1-d1024-a" not in some
    every = figures.decode_caption(_summary([_cell("p1-d1024-a", True)]))
    assert "with its own within-server 95 % interval;" in every and "except" not in every
    none = figures.decode_caption(_summary([_cell("p3-d1024-a", False)]))
    assert "no cell had one" in none and "within-server 95 % interval" not in none


def _row(cid: str, key: str, attempt: str, **extra: Any) -> dict[str, Any]:
    return {"cell_id": cid, "server_key": key, "attempt": attempt, "status": "ok", "arm": "a", "pass": 1, **extra}


STATIONARY = {"status": "stationary", "cell_id": "x", "opening_rounds": 6, "closing_rounds": 5, "step_pct": 0.1}


def test_every_server_without_a_bookend_is_listed_with_why():
    """h200-neighbour-tp1: the voided attempt's server measured a counted cell and never reached its
    bookend; 'every bookend stationary' was 4 servers of 5 and nothing said so."""
    voided = {"attempt": "0-v", "at": "round 2", "foreign": []}
    rows = [
        _row("p1-d1-s", "p1-s", "0-a"),
        _row("p1-d2-s", "p1-s", "0-a", bookend=STATIONARY),
        _row("p1-d1-w", "p1-w", "0-v"),  # its server voided during the next cell
        _row("p1-d2-w", "p1-w", "1-b", gpu_state={"policy": "retry", "contaminated_attempts": [voided]}),
        _row("p1-d3-w", "p1-w", "1-b", bookend=STATIONARY),
        _row("p2-d1-s", "p2-s", "0-f"),  # failed later, no record of why: the group went on
        _row("p2-d2-s", "p2-s", "1-g", bookend=STATIONARY),
        _row("p2-d1-w", "p2-w", "0-c"),  # the run stopped here
        _row("p3-d1-w", "p3-w", "0-d", status="failed"),  # counted nothing: no server to list
    ]
    listed = {(x["server_key"], x["attempt"]): x for x in bookends.servers_without(rows)}
    assert sorted(listed) == [("p1-w", "0-v"), ("p2-s", "0-f"), ("p2-w", "0-c")]
    assert (
        listed[("p1-w", "0-v")]["cells"] == ["p1-d1-w"] and "voided at 'round 2'" in listed[("p1-w", "0-v")]["reason"]
    )
    assert "ended early" in listed[("p2-s", "0-f")]["reason"]
    assert "the run stopped" in listed[("p2-w", "0-c")]["reason"]
    md = "\n".join(report_gpu.section(rows))
    assert "| p1-w (attempt 0-v) | p1-d1-w | - |" in md and "**none** (voided at 'round 2'" in md
    warned = [w for w in report_gpu.warnings(rows) if "no bookend" in w]
    assert len(warned) == 3 and any(w.startswith("server p2-w (attempt 0-c): no bookend") for w in warned)
    # a run from before bookends claims none: nothing to list
    assert bookends.servers_without([{**r, "bookend": None} for r in rows]) == []
