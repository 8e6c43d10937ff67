"""A report states exactly what was tested: a figure's caption names the points it draws without an
interval, every server without a bookend is listed, and a bookend tests the estimator that decided."""

from __future__ import annotations

from typing import Any

from e2e.report import figures


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
