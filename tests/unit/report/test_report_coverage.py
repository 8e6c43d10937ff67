"""A report states exactly what was tested: a figure's caption names the points it draws without an
interval, every server without a bookend is listed, and a bookend tests the estimator that decided."""

from __future__ import annotations

from typing import Any

import pytest

from e2e.analysis.run_analysis import RunAnalysis
from e2e.report import figures, report_gpu
from e2e.rundir.store import RunStore
from e2e.stats import bookends, estimate
from tests.support import ROOT


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


def test_a_bookend_tests_the_estimator_that_decided_the_run():
    """h200-neighbour-tp1 decided on the prefill-corrected estimate, and its runner tested p1-widened's
    bookend on the plain client values (-0.68 %); under the corrected ones it is +0.15 %."""
    a = RunAnalysis(ROOT / "results" / "h200-neighbour-tp1")
    assert a.estimator == estimate.CORRECTED
    b = a.bookends["p1-widened"]
    assert b["estimator"] == estimate.CORRECTED and b["step_pct"] == pytest.approx(0.15, abs=0.01)
    recorded = next(r["bookend"] for r in RunStore(a.root).cells() if r["cell_id"] == "p1-d32768-widened")
    assert "estimator" not in recorded and recorded["step_pct"] == pytest.approx(-0.68, abs=0.01)
    assert "under the prefill-corrected estimator" in "\n".join(report_gpu.section(list(a.cell_rows.values())))


def _rounds(ms: list[float], prefill: list[float | None], **extra: Any) -> list[dict[str, Any]]:
    """Rows of rounds whose corrected decode is `ms` per token (L=64, S=8) and whose client time also
    holds each round's long request's prefill."""
    out = []
    for k, (m, p) in enumerate(zip(ms, prefill)):
        for n, pf in ((64, p), (8, 0.1)):
            t = (pf or 0.1) + n * m / 1e3
            out.append({"cell_id": "c", "attempt": "0-a", "n_tokens": n, "round": k, "t_client_s": t, "valid": True})
            out[-1].update(server_prefill_s=pf, **extra)
    return out


def test_retest_keeps_what_it_cannot_test_again():
    steady = [10.0, 10.1, 9.9, 10.0, 10.05, 9.95]
    opening = _rounds(steady, [0.1] * 6)
    closing = _rounds(steady[:5], [0.3] * 5, phase="bookend")  # slower prefills only: client +36 %
    client = bookends.evaluate(
        bookends.round_ms(opening, 64, 8).tolist(),
        bookends.round_ms(closing, 64, 8).tolist(),
        0.01,
        1.0,
        server_attempt="0-a",
        cell_id="c",
        depth=1024,
    )
    assert client["status"] == "non-stationary"
    again = bookends.retest(client, opening + closing, estimate.CORRECTED, 64, 8)
    assert again["status"] == "stationary" and again["estimator"] == estimate.CORRECTED
    assert abs(again["step_pct"]) < 1.0
    assert bookends.retest(client, opening + closing, estimate.CLIENT, 64, 8) is client  # already under it
    untested = bookends.untested("the server failed during the closing rounds", cell_id="c", server_attempt="0-a")
    assert bookends.retest(untested, opening + closing, estimate.CORRECTED, 64, 8) is untested
    gap = _rounds(steady[:5], [0.3, 0.3, None, 0.3, 0.3], phase="bookend")  # a round without prefill
    assert bookends.retest(client, opening + gap, estimate.CORRECTED, 64, 8) is client
