"""report.md's decode under load: for a run above batch 1, the verdicts and the load table per
concurrency c (how each arm's step time and throughput move with the batch), from summary.json alone."""

from __future__ import annotations

from typing import Any

from e2e.design.point import Point
from e2e.report import summary as sm
from e2e.report.tables import render_markdown


def concurrencies(s: dict[str, Any]) -> list[int]:
    """The concurrencies a run's points span ([1] for a run at batch 1 only)."""
    return sorted({Point.of(c).concurrency for c in s["cells"]}) or [1]


def per_c(rows: list[dict[str, Any]], c: int) -> list[dict[str, Any]]:
    return [r for r in rows if Point.of(r).concurrency == c]


def load(s: dict[str, Any]) -> list[str]:
    """The section, only where the summary has a load table (a run above batch 1)."""
    rows = s.get("load")
    if not rows:
        return []
    f = s["run"]
    md = [
        "## Decode at batch c (c requests decoding together)",
        "",
        f"Every point of this run was timed on the {f.get('route') or 'primed'} route (docs/concepts/load.md): "
        "each cell's c prompts were prefilled once with one-token requests and reused, so every timed "
        "decode step ran the c requests together; a round counted only if the server's engine steps, "
        "prefix-cache hits and preemptions say it did. `ms / step` is one decode step of the whole batch "
        "(the variance model's mean over the servers, as the verdicts use it), `tokens/s` the c requests' "
        "decode throughput (c / step). The server's prefill and time to first token are the medians over "
        "the counted rounds of its per-request means, with distribution-free 95 % intervals: on this route "
        "a timed request prefills only its prompt's last block, so these stay small; at c > 1 the TTFT "
        "also holds the wait of requests scheduled behind the first.",
        "",
    ]
    for c in concurrencies(s):
        mine = per_c(rows, c)
        if mine:
            md += [f"### c = {c}", "", render_markdown(sm.LOAD, mine), ""]
    return md
