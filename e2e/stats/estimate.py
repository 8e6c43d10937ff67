"""The cell's point estimate: decode ms per token by differencing two output lengths.

    (median Y_long - median Y_short) / (long - short)

Prefill, queueing and HTTP costs are the same for both lengths and cancel; what remains is the
cost of the extra (long - short) decode steps. Y is what the client waited for, in one of two
spellings (the estimators; the run's manifest and report name the one that decided):

* "client": Y = the client's wall time of the request. The seed's definition, kept in every row
  and report as the check.
* "prefill-corrected" (where the prefill guard trusts the server's timings, per arm and point:
  e2e/stats/prefill_guard.py): Y = client wall time minus
  the server's own prefill time of that request (`server_prefill_s`, vLLM's
  request_prefill_time_seconds delta). Prefill has the same length in both requests, so the
  expectation is the client's; but at 32K a prefill takes ~2.7 s and its jitter (4-9 ms sd on the
  H200) is most of the noise of a 64-vs-8 difference. Subtracting each request's own prefill keeps
  what the client waits for after the first token, decode and HTTP included, and removes that
  jitter: on the committed H200 rows a 32K cell's 95 % interval went from +-1.3-2.1 % to
  +-0.3-0.5 % (docs/concepts/estimator.md).

The server's own decode time is differenced the same way and reported beside both. Pure: rows in,
numbers out. Intervals and decisions live in stats.py and verdicts.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from statistics import median
from typing import Any

CLIENT, CORRECTED = "client", "prefill-corrected"
ESTIMATORS = (CLIENT, CORRECTED)
MIXED = "per point"  # a run whose arms and points did not all get the same one (e2e/stats/prefill_guard.py)
DESCRIPTION = {
    CLIENT: "(median T{L} - median T{S}) / {D} of the client's wall times",
    CORRECTED: "(median Y{L} - median Y{S}) / {D}, Y = client wall time minus the server's prefill "
    "time of the same request",
    MIXED: "(median Y{L} - median Y{S}) / {D}, Y = client wall time minus the server's prefill time where "
    "the prefill guard trusts it, the client wall time elsewhere (per arm and point: the estimator line)",
}


def request_value(estimator: str) -> Callable[[Mapping[str, Any]], float | None]:
    """Y of one request row under an estimator (seconds), None where it cannot be formed."""
    if estimator == CLIENT:
        return lambda r: r.get("t_client_s")
    if estimator == CORRECTED:

        def corrected(r: Mapping[str, Any]) -> float | None:
            t, p = r.get("t_client_s"), r.get("server_prefill_s")
            return None if t is None or p is None else t - p

        return corrected
    raise ValueError(f"unknown estimator {estimator!r} (one of {', '.join(ESTIMATORS)})")


def describe(estimator: str, n_long: int, n_short: int) -> str:
    return DESCRIPTION[estimator].format(L=n_long, S=n_short, D=n_long - n_short)


def _med(xs: list[float]) -> float | None:
    return median(xs) if xs else None


def valid_values(rows: Iterable[dict[str, Any]], n: int, field: str) -> list[float]:
    return [r[field] for r in rows if r["valid"] and r["n_tokens"] == n and r.get(field) is not None]


def differenced_ms(long_vals: list[float], short_vals: list[float], n_long: int, n_short: int) -> float | None:
    ml, ms = _med(long_vals), _med(short_vals)
    if ml is None or ms is None:
        return None
    return (ml - ms) / (n_long - n_short) * 1e3


def estimator_ms(rows: Iterable[dict[str, Any]], n_long: int, n_short: int, estimator: str) -> float | None:
    """The cell's estimate under `estimator` from its valid rows; None when a length has no value.
    A row without the estimator's value (a missing server prefill time) drops that request only."""
    f = request_value(estimator)
    rows = [r for r in rows if r["valid"]]
    known = {n: [v for v in (f(r) for r in rows if r["n_tokens"] == n) if v is not None] for n in (n_long, n_short)}
    return differenced_ms(known[n_long], known[n_short], n_long, n_short)


def cell_estimate(rows: list[dict[str, Any]], n_long: int, n_short: int) -> dict[str, Any]:
    tl = valid_values(rows, n_long, "t_client_s")
    ts = valid_values(rows, n_short, "t_client_s")
    dl = valid_values(rows, n_long, "server_decode_s")
    ds = valid_values(rows, n_short, "server_decode_s")
    overhead = [r["t_client_s"] - r["server_e2e_s"] for r in rows if r["valid"] and r.get("server_e2e_s") is not None]
    return {
        "n_valid_long": len(tl),
        "n_valid_short": len(ts),
        "n_invalid": sum(1 for r in rows if not r["valid"]),
        "t_long_median_s": _med(tl),
        "t_short_median_s": _med(ts),
        "decode_ms_per_token": differenced_ms(tl, ts, n_long, n_short),
        "decode_corrected_ms_per_token": estimator_ms(rows, n_long, n_short, CORRECTED),
        "server_decode_ms_per_token": differenced_ms(dl, ds, n_long, n_short),
        # The long request's own decode span over its (n_long - 1) inter-token steps.
        "server_itl_ms": (median(dl) / (n_long - 1) * 1e3) if dl else None,
        "client_overhead_ms_median": (median(overhead) * 1e3) if overhead else None,
    }


def median_interval(values: Iterable[float], level: float = 0.95) -> tuple[float, float, float] | None:
    """The median and its distribution-free interval (order statistics: the number of values below
    the true median is Binomial(n, 1/2)), or None with fewer than 2 values. With few values the
    interval is the widest the data allow (the sample's extremes), never narrower than they justify."""
    from scipy.stats import binom

    xs = sorted(v for v in values if v is not None)
    n = len(xs)
    if n < 2:
        return None
    k = max(int(binom.ppf((1 - level) / 2, n, 0.5)) - 1, 0)  # 0-based: P(X <= k) <= (1 - level) / 2
    return float(median(xs)), xs[k], xs[n - 1 - k]
