"""The cell's point estimate: decode ms per token by differencing two output lengths.

    (median T_long - median T_short) / (long - short)

Prefill, queueing and HTTP costs are the same for both lengths and cancel; what remains is the
cost of the extra (long - short) decode steps. The server's own decode time is differenced the same
way and reported beside it. Pure: rows in, numbers out. Intervals and decisions live in stats.py.
"""
from __future__ import annotations

from statistics import median
from typing import Any, Iterable


def _med(xs: list[float]) -> float | None:
    return median(xs) if xs else None


def valid_values(rows: Iterable[dict[str, Any]], n: int, field: str) -> list[float]:
    return [r[field] for r in rows if r["valid"] and r["n_tokens"] == n and r.get(field) is not None]


def differenced_ms(long_vals: list[float], short_vals: list[float], n_long: int, n_short: int) -> float | None:
    ml, ms = _med(long_vals), _med(short_vals)
    if ml is None or ms is None:
        return None
    return (ml - ms) / (n_long - n_short) * 1e3


def cell_estimate(rows: list[dict[str, Any]], n_long: int, n_short: int) -> dict[str, Any]:
    tl = valid_values(rows, n_long, "t_client_s")
    ts = valid_values(rows, n_short, "t_client_s")
    dl = valid_values(rows, n_long, "server_decode_s")
    ds = valid_values(rows, n_short, "server_decode_s")
    overhead = [r["t_client_s"] - r["server_e2e_s"] for r in rows
                if r["valid"] and r.get("server_e2e_s") is not None]
    return {
        "n_valid_long": len(tl),
        "n_valid_short": len(ts),
        "n_invalid": sum(1 for r in rows if not r["valid"]),
        "t_long_median_s": _med(tl),
        "t_short_median_s": _med(ts),
        "decode_ms_per_token": differenced_ms(tl, ts, n_long, n_short),
        "server_decode_ms_per_token": differenced_ms(dl, ds, n_long, n_short),
        # The long request's own decode span over its (n_long - 1) inter-token steps.
        "server_itl_ms": (_med(dl) / (n_long - 1) * 1e3) if dl else None,
        "client_overhead_ms_median": (_med(overhead) * 1e3) if overhead else None,
    }
