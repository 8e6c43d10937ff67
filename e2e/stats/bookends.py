"""Bookends: did a server move between its opening and its close? Pure functions; the simulation
that checks the test's false-alarm rate is e2e/validation/conformance_bookends.py
(`python -m e2e.validation.conformance_bookends`; `python -m e2e.stats.bookends`, the name the
committed reports give, runs it too).

At the end of each server's life (after its last depth with `--server-mode per-arm-pass`, after its
cell in fresh mode) the runner measures `workload.bookend_rounds` more rounds of the server's FIRST
depth. Their request rows carry phase "bookend" and never enter an estimate (store.counted_requests).
The closing rounds are compared with the opening cell's own timed rounds:

    value per round   (T_long - T_short) / (long - short), ms per token (the cell estimate's pairing)
    test              Mann-Whitney U, exact, two-sided, closing rounds against opening rounds
    step              median(closing) / median(opening) - 1
    non-stationary    p < stats.bookend_alpha (0.01) AND |step| >= stats.bookend_min_step_pct (1 %)

The exact test's null distribution is every split of the rounds into opening and closing: under a
stationary server (rounds exchangeable) its false-alarm rate is at most alpha whatever the noise's
shape. The simulation checks that through these same functions, and shows what it does not
cover: round-to-round correlation (AR(1)) raises the rate, which is a server that drifts, i.e. what
the flag is for. The 1 % floor keeps a real but harmless step on a very quiet GPU from marking the
server: a step of s moves the cell's estimate, taken between the two, by at most s. A design whose
smallest attainable p is not below alpha (e.g. 5 opening and 3 closing rounds: 2/56) is not tested
at all, and the row says so: a test that cannot reject must not read as "stationary".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from math import comb
from typing import Any

import numpy as np
from scipy.stats import mannwhitneyu

from e2e.stats import cells as stats
from e2e.stats.estimate import CLIENT

TEST = "Mann-Whitney U, exact, two-sided: per-round decode ms/token, closing vs opening rounds"
MIN_OPENING = 3


def round_ms(rows: Iterable[dict[str, Any]], n_long: int, n_short: int, estimator: str = CLIENT) -> np.ndarray:
    """Per-round differenced decode ms/token of valid rounds (both lengths valid), in round order,
    under `estimator` (e2e/stats/estimate.py)."""
    long_, short = stats.round_values(rows, n_long, n_short, estimator)
    d = (long_ - short) / (n_long - n_short) * 1e3
    valid: np.ndarray = d[np.isfinite(d)]
    return valid


def smallest_p(n_open: int, n_close: int) -> float:
    """The smallest two-sided p the exact test can give: every closing round beyond every opening one."""
    return min(1.0, 2 / comb(n_open + n_close, n_close)) if n_open and n_close else 1.0


def testable(n_open: int, n_close: int, alpha: float) -> bool:
    return n_open >= MIN_OPENING and n_close >= 1 and smallest_p(n_open, n_close) < alpha


def step_p(opening: np.ndarray, closing: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(p, step %) of closing against opening, along the last axis: one server (1-D) or many
    simulated ones (2-D, a row each) through the same code."""
    p = mannwhitneyu(closing, opening, alternative="two-sided", method="exact", axis=-1).pvalue
    step = (np.median(closing, axis=-1) / np.median(opening, axis=-1) - 1) * 100
    return np.asarray(p), np.asarray(step)


def flagged(p: np.ndarray, step: np.ndarray, alpha: float, min_step_pct: float) -> np.ndarray:
    out: np.ndarray = (p < alpha) & (np.abs(step) >= min_step_pct)
    return out


def evaluate(
    opening: Sequence[float],
    closing: Sequence[float],
    alpha: float,
    min_step_pct: float,
    estimator: str = CLIENT,
    **ident: Any,
) -> dict[str, Any]:
    """The cell row's `bookend` (formats.BookendResult) from the per-round values under `estimator`."""
    o, c = np.asarray(opening, dtype=float), np.asarray(closing, dtype=float)
    out: dict[str, Any] = {
        **ident,
        "estimator": estimator,
        "opening_rounds": int(o.size),
        "closing_rounds": int(c.size),
        "alpha": alpha,
        "min_step_pct": min_step_pct,
        "test": TEST,
        "opening_ms": float(np.median(o)) if o.size else None,
        "closing_ms": float(np.median(c)) if c.size else None,
    }
    if not testable(o.size, c.size, alpha):
        return {
            **out,
            "status": "untested",
            "reason": f"{o.size} opening and {c.size} closing valid rounds cannot reach p < {alpha:g} "
            f"(smallest p {smallest_p(o.size, c.size):.3g})",
        }
    p, step = step_p(o, c)
    hit = bool(flagged(p, step, alpha, min_step_pct))
    return {
        **out,
        "status": "non-stationary" if hit else "stationary",
        "p_value": float(p),
        "step_pct": float(step),
        "reason": None,
    }


def untested(reason: str, **ident: Any) -> dict[str, Any]:
    return {**ident, "status": "untested", "reason": reason, "test": TEST}


def retest(
    bookend: dict[str, Any], requests: Iterable[dict[str, Any]], estimator: str, n_long: int, n_short: int
) -> dict[str, Any]:
    """A measured bookend tested again under the estimator that decided the run (the runner tests the
    plain client values: the run's estimator is chosen only once every cell is in). Its opening rounds
    are the opening cell's timed rows of the server's attempt, its closing rounds that attempt's
    "bookend" rows. Kept as it is when it was never measured (untested before its closing rounds),
    is already under `estimator`, or a row lacks that estimator's value (an older run's rows)."""
    if "closing_rounds" not in bookend or bookend.get("estimator", CLIENT) == estimator:
        return bookend
    mine = [
        r for r in requests if r["cell_id"] == bookend.get("cell_id") and r["attempt"] == bookend.get("server_attempt")
    ]
    opening = [r for r in mine if r.get("phase") != "bookend"]
    closing = [r for r in mine if r.get("phase") == "bookend"]
    o, c = round_ms(opening, n_long, n_short, estimator), round_ms(closing, n_long, n_short, estimator)
    if (o.size, c.size) != (bookend.get("opening_rounds"), bookend.get("closing_rounds")):
        return bookend  # not every round has the estimator's value: the client test stands, as recorded
    ident = {k: bookend.get(k) for k in ("server_attempt", "cell_id", "depth")}
    return evaluate(o.tolist(), c.tolist(), bookend["alpha"], bookend["min_step_pct"], estimator, **ident)


def server_flags(cell_rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """server_key -> that server's bookend result, plus the cells it covers (`cells`: the cell ids
    whose rows name the same attempt; cells of the group measured on an earlier, failed server of
    the same key are not covered). For the report and the verdict table."""
    rows = list(cell_rows)
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        b = r.get("bookend")
        if not b:
            continue
        key = r.get("server_key") or r["cell_id"]
        cells = [
            x["cell_id"]
            for x in rows
            if (x.get("server_key") or x["cell_id"]) == key and x.get("attempt") == r.get("attempt")
        ]
        out[key] = {**b, "attempt": r.get("attempt"), "arm": r.get("arm"), "pass": r.get("pass"), "cells": cells}
    return out


def servers_without(cell_rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The servers (server key and attempt) whose counted cells no bookend covers, each with why: a
    server voided or failed before its end never measures its closing rounds, and "every bookend
    stationary" must not read as every server. Empty for a run that records no bookend at all (from
    before bookends): it claims none."""
    rows = list(cell_rows)
    if not any(r.get("bookend") for r in rows):
        return []
    voided = {a.get("attempt"): a for r in rows for a in (r.get("gpu_state") or {}).get("contaminated_attempts") or []}
    servers: dict[tuple[str, str], list[int]] = {}  # (key, attempt) -> its rows' places in cells.jsonl order
    for i, r in enumerate(rows):
        servers.setdefault((r.get("server_key") or r["cell_id"], str(r.get("attempt"))), []).append(i)
    out = []
    for (key, attempt), places in servers.items():
        group = [rows[i] for i in places]
        counted = [r["cell_id"] for r in group if r.get("status") == "ok"]
        if not counted or any(r.get("bookend") for r in group):
            continue
        # a later row of the same group on another server: this one ended early and the group went on
        later = any(k == key and a != attempt and max(p) > max(places) for (k, a), p in servers.items())
        if attempt in voided:
            why = f"voided at '{voided[attempt].get('at')}' by another process on the GPU, before its end"
        elif later:
            why = "its server ended early, voided or failed, and the group went on on a fresh one"
        else:
            why = "the run stopped before its server's end"
        out.append({"server_key": key, "attempt": attempt, "cells": counted, "reason": why})
    return out


if __name__ == "__main__":  # the reports' `python -m e2e.stats.bookends` (tests/guarantees/test_layers.py: SHIMS)
    from e2e.validation.conformance_bookends import main

    raise SystemExit(main())
