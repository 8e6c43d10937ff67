"""Server starts from the cell rows: per arm what the compile cache saved, and per start where its
time went (e2e/serve/startup_phases.py, read from the server's log)."""

from __future__ import annotations

from collections.abc import Iterable
from statistics import median_high
from typing import Any

PHASES = (
    "api_to_engine_s",
    "engine_to_worker_s",
    "weights_s",
    "compile_s",
    "compile_cache",
    "graph_capture_s",
    "after_capture_s",
    "engine_init_s",
    "init_end_to_api_s",
    "total_logged_s",
)


def _in_run_order(cell_rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(cell_rows, key=lambda c: c.get("index", 0))


def startup_table(cell_rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per arm: server starts in run order. The first start of an arm fills its compile cache;
    later starts reuse it (server.compile_cache = per-arm), so first - median(later) is the time
    the cache saved per start (cells sharing a server record startup 0 and are left out). A later
    start whose log says the cache missed (a resume on another machine, a changed compile key)
    compiled like the first: it is counted in later_cache_misses and not credited to the cache."""
    rows_in = list(cell_rows)
    out = []
    for arm in dict.fromkeys(c["arm"] for c in rows_in):
        rows = [c for c in _in_run_order(rows_in) if c["arm"] == arm and c.get("status") == "ok" and c.get("startup_s")]
        starts = [float(c["startup_s"]) for c in rows]
        cache = [(c.get("startup_phases") or {}).get("compile_cache") for c in rows]
        med = median_high(starts[1:]) if starts[1:] else None
        credited = [t for t, k in zip(starts[1:], cache[1:]) if k != "miss"]
        cmed = median_high(credited) if credited else None
        out.append(
            {
                "arm": arm,
                "starts": len(starts),
                "first_s": starts[0] if starts else None,
                "later_median_s": med,
                "later_cache_misses": cache[1:].count("miss"),
                "saved_per_start_s": (starts[0] - cmed) if starts and cmed is not None else None,
            }
        )
    return out


def start_phases(cell_rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per server start, in run order: startup_s and where it went. startup_s - total_logged_s is
    what came before vLLM's first log line (the interpreter starting, importing vLLM)."""
    out = []
    for c in _in_run_order(cell_rows):
        ph = c.get("startup_phases")
        if not c.get("startup_s") or not isinstance(ph, dict):
            continue
        row = {
            "cell_id": c["cell_id"],
            "arm": c["arm"],
            "pass": c["pass"],
            "startup_s": float(c["startup_s"]),
            **{k: ph.get(k) for k in PHASES},
        }
        total = ph.get("total_logged_s")
        row["before_log_s"] = row["startup_s"] - total if total is not None else None
        out.append(row)
    return out
