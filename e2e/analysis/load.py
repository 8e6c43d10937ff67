"""Decode under load: per arm and design point of a run above batch 1, what the step costs, what it
serves, and what the server says the prompts cost.

Rows of the load table (summary.json `load`, report.md "Decode at batch c"):
* `step_ms` with its 95 % interval: the arm's decode step at the point, the variance model's mean
  over its servers (e2e/stats/one_arm.py), as the verdicts see it;
* `tokens_per_s`: c / step, the decode throughput of the c requests together, with the same
  interval mapped through (a slower step is fewer tokens per second);
* `prefill_ms` and `ttft_ms`: the server's own request prefill time and time to first token
  (vLLM's histograms, per-request means of each round: e2e/run/batch.py), the median over the
  counted rounds with its distribution-free 95 % interval. On the primed route a timed request
  prefills only its prompt's last, uncached block; these say how small that stayed, and at c > 1
  how long the c requests queued behind one another for their first token.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from e2e.design.point import Point
from e2e.stats import estimate, one_arm


def _ms(rows: Iterable[dict[str, Any]], field: str) -> dict[str, float | None]:
    got = estimate.median_interval(1e3 * r[field] for r in rows if r.get(field) is not None)
    if got is None:
        return {"median": None, "lo": None, "hi": None}
    m, lo, hi = got
    return {"median": m, "lo": lo, "hi": hi}


def load_table(a: Any) -> list[dict[str, Any]]:
    """One row per arm and point (a RunAnalysis `a` of a run at some c > 1), in the run's point order."""
    out = []
    for p in a.points:
        for arm in a.arms:
            cells = a._cells_of(arm, p)
            est = one_arm.arm_estimate(a.fit, arm, p, cells)
            rows = [r for cid in a.cell_ids_of(arm, p) for r in a.requests_of.get(cid, [])]
            step, lo, hi = est["estimate_ms"], est["ci_lo_ms"], est["ci_hi_ms"]
            out.append(
                {
                    "arm": arm,
                    **p.fields(),
                    "concurrency": p.concurrency,  # every row names it: the table is read per c
                    "n_cells": est["n_cells"],
                    "step_ms": step,
                    "step_ci_lo_ms": lo,
                    "step_ci_hi_ms": hi,
                    "ci_kind": est["ci_kind"],
                    "tokens_per_s": _per_s(p, step),
                    "tokens_per_s_ci_lo": _per_s(p, hi),
                    "tokens_per_s_ci_hi": _per_s(p, lo),
                    **{f"prefill_ms_{k}": v for k, v in _ms(rows, "server_prefill_s").items()},
                    **{f"ttft_ms_{k}": v for k, v in _ms(rows, "server_ttft_s").items()},
                    "n_rounds": len(rows),
                }
            )
    return out


def _per_s(p: Point, ms: float | None) -> float | None:
    return None if ms is None or ms <= 0 else p.concurrency * 1e3 / ms
