"""The request row as it crosses stages, typed: what a cell's rounds emit (MeasuredRow, e2e/run/measure.py
and batch.py), and the requests.jsonl row that the run folder writes and reads and the statistics read
(RequestRowDict = MeasuredRow plus the cell it belongs to).

TypedDicts, so a row stays the plain dict it is on disk and in memory (nothing changes at run time) while
the type checker holds every stage to the fields. They live with the run folder that writes and reads
the rows (the statistics, above it, read rows typed by them): e2e/rundir/formats.py re-exports them next
to its pydantic models (RequestRow), which check the rows when written and read; tests/unit/rundir/test_row_models.py
holds the two to the same fields. A row read from disk may carry fields neither names (a reader ignores them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypedDict


class RoundRequestDict(TypedDict, total=False):
    """One request of a round at c > 1 (formats.RoundRequest)."""

    t_client_s: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    finish_reason: str | None
    error: str | None
    invalid_reason: str | None


class _Measured(TypedDict):
    n_tokens: int
    valid: bool


# Required fields by totality, not Required[...]: under `from __future__ import annotations` Python 3.11
# does not see Required in a TypedDict's annotations (its __required_keys__ would be wrong).
class MeasuredRow(_Measured, total=False):
    """One timed request (or round at c > 1) as measured, before the run names its cell."""

    round: int | None
    position: int  # 0: the round's first request, 1: its second (the lengths alternate their order)
    t_start_unix: float
    t_client_s: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    finish_reason: str | None
    error: str
    invalid_reason: str | None
    server_decode_s: float | None
    server_prefill_s: float | None
    server_e2e_s: float | None
    server_ttft_s: float | None
    server_queue_s: float | None
    requests: list[RoundRequestDict] | None  # c > 1: the round's requests
    server: dict[str, float] | None  # c > 1: formats.RoundServer


# The cell a row belongs to (a cells.jsonl row's first fields too); functional form: `pass` is a keyword.
RowIdentity = TypedDict(
    "RowIdentity", {"schema_version": int, "cell_id": str, "attempt": str, "pass": int, "arm": str, "depth": int}
)


class RequestRowDict(RowIdentity, MeasuredRow, total=False):
    """One requests.jsonl row (formats.RequestRow checks it)."""

    phase: Literal["bookend"] | None
    voided: str | None
    concurrency: int | None


# Fields a row may carry that formats.RequestRow leaves to extra="allow" (kept, never checked).
UNCHECKED = frozenset({"position", "t_start_unix", "error", "server_ttft_s", "server_queue_s"})


# What the statistics take: a request row, as the run folder reads it (RequestRowDict) or as a caller builds
# one in memory (a plain dict: the simulations, the route check). Read only.
Row = Mapping[str, Any]
