"""The on-disk formats of a run folder and the files derived from it: one version per file kind,
the timestamp format, and (below) the typed rows."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal, cast

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from e2e.design.config import is_plain_name
from e2e.errors import UserError
from e2e.rundir import manifest_model
from e2e.rundir.rows import MeasuredRow as MeasuredRow  # re-exported: the rows' types, in one place
from e2e.rundir.rows import RequestRowDict as RequestRowDict
from e2e.rundir.rows import RoundRequestDict as RoundRequestDict
from e2e.rundir.rows import RowIdentity


def now() -> str:
    """The timestamp every file of a run uses: UTC, ISO 8601, seconds."""
    return datetime.now(UTC).isoformat(timespec="seconds")


# One version per file kind. A reader refuses a version it does not know (formats.check_version).
VERSIONS = {
    "manifest": 1,  # manifest.json
    "plan": 1,  # plan.json (a list: the version is the manifest's)
    "cells": 1,  # cells.jsonl rows
    "requests": 1,  # requests.jsonl rows
    "profiles": 1,  # profiles.jsonl rows (kernel profiles, e2e/profile/)
    "summary": 3,  # summary.json / summary.csv / comparisons.csv / report.md (3: the whole record of report.md)
    "compare": 4,  # compare --json (2: verdicts, exit status; 3: unfinished runs named; 4: inert rows, decision_measured)
    "history": 4,  # history.csv / history.json (2: change points; 3: unfinished runs named; 4: inert series, decision_measured)
    "gsm8k-unit": 1,  # gsm8k/<arm>/r<k>/unit.json
    "gsm8k-summary": 1,  # gsm8k/summary.json
    "kernels": 1,  # kernels_check rows.jsonl and its summary
}


# -- names: a run folder is data, never a path --------------------------------------------------------
# A field that becomes a file or folder name (cell ids, server keys, attempts, arms: logs/<key>.a<n>.log,
# cells/<key>/gpu-a<n>/) is a plain name when read, so a planted "../x" or "/abs" never leads a resume
# out of the run folder; a field that is a path inside it (log_path) is plain names joined by "/".
def _shown(v: str) -> str:
    return repr(v if len(v) <= 60 else v[:57] + "...")


def _plain(v: str) -> str:
    if not is_plain_name(v):
        raise ValueError(f"{_shown(v)} is not a plain name (letters, digits, '_', '.', '-'; never a path)")
    return v


def is_inside_path(v: str) -> bool:
    """Plain names joined by '/': "/abs", "a//b" and "a/../b" are not ("/abs" has an empty part)."""
    return all(is_plain_name(p) for p in v.split("/"))


def _inside(v: str) -> str:
    if not is_inside_path(v):
        raise ValueError(f"{_shown(v)} is not a path inside the run folder (plain names joined by '/')")
    return v


PlainName = Annotated[str, Field(min_length=1), AfterValidator(_plain)]
InsidePath = Annotated[str, Field(min_length=1), AfterValidator(_inside)]


# -- the rows --------------------------------------------------------------------------------------
# A row is a dict on disk (JSONL) and in memory; these models are its contract: the fields every
# reader relies on, typed, checked once when a row is built (cell_row / request_row) and again when
# it is read (read_rows). Other fields are allowed and kept (extra="allow"): a reader of version N
# ignores what it does not know, and older rows with fewer optional fields still read.
class _Row(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    schema_version: int
    cell_id: PlainName
    attempt: PlainName
    pass_: int = Field(alias="pass", ge=1)
    arm: PlainName
    depth: int = Field(gt=0)


class RequestRow(_Row):
    """One timed request (requests.jsonl). Client time in seconds; server_* from /metrics deltas."""

    n_tokens: int = Field(gt=0)
    round: int | None = Field(default=None, ge=0)
    t_client_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    valid: bool
    invalid_reason: str | None = None
    server_decode_s: float | None = None
    server_prefill_s: float | None = None
    server_e2e_s: float | None = None
    # "bookend": a closing round of the server's first depth (e2e/stats/bookends.py), never in an estimate
    # (store.counted_requests leaves it out). Absent: a timed round of the cell.
    phase: Literal["bookend"] | None = None
    # Why the attempt was voided (its server failed, or another process was on its GPU): set, with
    # valid false, when the attempt is voided (store.void_rows). Absent: not voided, or a folder from
    # before the mark (there only the attempt match keeps a voided attempt's rows out).
    voided: str | None = None
    # A round at concurrency c > 1 (e2e/run/batch.py): this row stands for the round's c requests of
    # n_tokens, t_client_s is the round's span and server_*_s the per-request means; absent at c = 1.
    concurrency: int | None = Field(default=None, ge=2)
    requests: list[RoundRequest] | None = None
    server: RoundServer | None = None


class _Part(BaseModel):
    model_config = ConfigDict(extra="allow")


class RoundRequest(_Part):
    """One request of a round at c > 1: its own time and the server's usage."""

    t_client_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    invalid_reason: str | None = None


class RoundServer(_Part):
    """The server around a round at c > 1, from /metrics deltas: engine steps (c requests that decode
    together take n of them), tokens scheduled, prefix-cache queries and hits, preemptions."""

    steps: float | None = None
    tokens: float | None = None
    prefix_queries: float | None = None
    prefix_hits: float | None = None
    preemptions: float | None = None


class GpuProcess(_Part):
    """A process on a cell's GPU that is not the cell's server (e2e/gpu/gpu_state.py)."""

    gpu: int | None = None
    pid: int
    name: str | None = None
    used_mib: float | None = None
    visible: bool = True  # False: its pid is not visible on this host (another namespace)
    first_seen: str | None = None  # the sample that first showed it: "ready", "round 3", ...


class GpuCellState(_Part):
    """A cell's GPUs around its measurement: readings between rounds, never inside a timed request."""

    available: bool  # False: no GPU, no driver or no NVML here (`reason` says which)
    reason: str | None = None
    policy: Literal["retry", "warn", "fail"]
    source: Literal["nvml", "nvidia-smi", "amdsmi", "amd-smi"] | None = None
    gpus: list[dict[str, Any]] = []  # index, uuid, name
    samples: int = 0
    failed_readings: int = 0  # readings that failed where readings were possible (samples: those that did not)
    contaminated: bool = False  # a foreign process seen during the attempt this row records
    foreign: list[GpuProcess] = []
    pre_start_foreign: list[GpuProcess] = []  # on the GPU before the server started (its first cell)
    own_seen: bool | None = None  # NVML listed the server's own processes (False: it may be blind)
    sm_mhz: list[float] | None = None  # [min, max] over the cell's samples
    mem_mhz: list[float] | None = None
    power_w: list[float] | None = None
    round_power_w: list[float] | None = None  # [min, max] mean power over a round (energy counter)
    temp_c: list[float] | None = None
    throttled_rounds: list[int] = []
    throttle_reasons: list[str] = []
    contaminated_attempts: list[dict[str, Any]] = []  # earlier attempts voided (retry): attempt, at, foreign


class VoidedAttempt(_Part):
    """cells/<server>/gpu-a<n>/voided.json: the attempt `retry` voided, and why (e2e/gpu/gpu_state.py)."""

    cell_id: PlainName | None = None
    attempt: PlainName
    at: str
    foreign: list[GpuProcess] = []


class BookendResult(_Part):
    """The server's first depth measured again at the end of its life (e2e/stats/bookends.py)."""

    status: Literal["stationary", "non-stationary", "untested"]
    reason: str | None = None
    server_attempt: str | None = None  # the attempt (server) it belongs to
    cell_id: str | None = None  # the opening cell: the server's first
    depth: int | None = None
    opening_rounds: int = 0
    closing_rounds: int = 0
    opening_ms: float | None = None  # median per-round decode ms/token
    closing_ms: float | None = None
    step_pct: float | None = None  # closing / opening - 1, in %
    p_value: float | None = None
    alpha: float | None = None
    min_step_pct: float | None = None
    test: str | None = None
    foreign: list[GpuProcess] = []  # a foreign process during the closing rounds: untested


class CellRow(_Row):
    """One finished cell, ok or failed (cells.jsonl): its final attempt, estimate, routing, timings."""

    index: int | None = Field(default=None, ge=0)
    server_key: PlainName | None = None
    # "skipped": not measured because the server cannot hold it (its KV cache; the run goes on)
    status: Literal["ok", "failed", "skipped"]
    startup_s: float | None = None
    startup_phases: dict[str, Any] | None = None  # where the server start went (startup_phases.py)
    warmup_s: float | None = None
    measure_s: float | None = None
    stopped_by: str | None = None
    rounds: int | None = None
    decode_ms_per_token: float | None = None
    decode_corrected_ms_per_token: float | None = None  # client minus server prefill (e2e/stats/estimate.py)
    server_decode_ms_per_token: float | None = None
    client_overhead_ms_median: float | None = None
    error: str | None = None
    log_path: InsidePath | None = None
    log_tail: str | None = None
    routing: dict[str, Any] | None = None
    finished: str | None = None
    # Where it ran, with --executor ray (absent from the local executor's rows: one host, one at a time).
    slot: str | None = None  # e.g. "n0.g2-3": node 0, GPUs 2 and 3 (e2e/run/executors/slots.py)
    slot_host: str | None = None  # the slot's node address
    executor: str | None = None  # "ray"
    at_once: int | None = Field(default=None, ge=1)  # most cells running at once on that host meanwhile
    gpu_state: GpuCellState | None = None  # absent in rows from before it was recorded
    concurrency: int | None = Field(default=None, ge=2)  # requests per round (absent at 1)
    bookend: BookendResult | None = None  # on the last cell of each server that reached its end


class PlanEntry(BaseModel):
    """One planned cell (plan.json is a list of these, in run order). Strict: the entries are handed
    on as read, so a depth of 1.0 or true (which lax validation would coerce) is refused, not used."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, strict=True)

    index: int = Field(ge=0)
    cell_id: PlainName
    pass_: int = Field(alias="pass", ge=1)
    arm: PlainName
    depth: int = Field(gt=0)
    server_key: PlainName
    rounds: int | None = Field(default=None, ge=1)  # set by adaptive replication's allocation
    concurrency: int = Field(default=1, ge=1)  # absent before batch sizes above 1 (and at 1)


class ProfileKernel(_Part):
    """One kernel (a CPU op on the CPU lane) of a decode step: long minus short round, per step."""

    name: str
    group: str
    calls_per_step: float
    us_per_step: float


class ProfileRow(_Row):
    """A cell's kernel profile (profiles.jsonl, e2e/profile/capture.py): ok, or missing and why."""

    status: Literal["ok", "missing"]
    reason: str | None = None
    concurrency: int | None = Field(default=None, ge=2)
    source: str | None = None  # "device kernels" | "cpu ops"
    steps: int | None = None  # long_tokens - short_tokens: what the rounds' difference is divided by
    kernels: list[ProfileKernel] = []
    groups_us: dict[str, float] = {}
    step_us: float | None = None
    traces: list[InsidePath] = []


ROW_MODELS: dict[str, type[BaseModel]] = {"cells": CellRow, "requests": RequestRow, "profiles": ProfileRow}


# -- the rows as they cross stages -------------------------------------------------------------------
# The same rows as TypedDicts: a row stays a plain dict (on disk and in memory) and the type checker holds
# every stage that builds or reads one to its fields. The request row's are e2e/rundir/rows.py's (the
# statistics read it, and sit below this stage); tests/unit/rundir/test_row_models.py holds each to its model above.
class _CellStatus(RowIdentity):
    status: Literal["ok", "failed", "skipped"]


class CellRowDict(_CellStatus, total=False):  # required fields by totality (e2e/rundir/rows.py says why)
    """One cells.jsonl row (CellRow checks it)."""

    index: int | None
    server_key: str | None
    startup_s: float | None
    startup_phases: dict[str, Any] | None
    warmup_s: float | None
    measure_s: float | None
    warmup_valid: bool
    stopped_by: str | None
    rounds: int | None
    decode_ms_per_token: float | None
    decode_corrected_ms_per_token: float | None
    server_decode_ms_per_token: float | None
    client_overhead_ms_median: float | None
    error: str | None
    log_path: str | None
    log_tail: str | None
    leftover_pids: list[int]
    routing: dict[str, Any] | None
    finished: str | None
    slot: str | None
    slot_host: str | None
    executor: str | None
    at_once: int | None
    gpu_state: dict[str, Any] | None  # GpuCellState
    concurrency: int | None
    bookend: dict[str, Any] | None  # BookendResult
    # the cell's estimate (e2e/stats/estimate.py cell_estimate), beside the fields CellRow checks
    n_valid_long: int
    n_valid_short: int
    n_invalid: int
    t_long_median_s: float | None
    t_short_median_s: float | None
    server_itl_ms: float | None


# Fields a cell row may carry that CellRow leaves to extra="allow" (kept, never checked).
CELL_UNCHECKED = frozenset(
    {"warmup_valid", "leftover_pids", "n_valid_long", "n_valid_short", "n_invalid", "t_long_median_s"}
    | {"t_short_median_s", "server_itl_ms"}
)


def _build(kind: str, fields: dict[str, Any]) -> dict[str, Any]:
    row = {"schema_version": VERSIONS[kind], **fields}
    ROW_MODELS[kind].model_validate(row)  # a harness bug surfaces here, not in a later report
    return row


def cell_row(**fields: Any) -> CellRowDict:
    """The one constructor of a cells.jsonl row (pass `pass` as pass_=...), checked by CellRow."""
    if "pass_" in fields:
        fields["pass"] = fields.pop("pass_")
    return cast(CellRowDict, _build("cells", fields))


def request_row(**fields: Any) -> RequestRowDict:
    """The one constructor of a requests.jsonl row, checked by RequestRow."""
    if "pass_" in fields:
        fields["pass"] = fields.pop("pass_")
    return cast(RequestRowDict, _build("requests", fields))


def profile_row(**fields: Any) -> dict[str, Any]:
    """The one constructor of a profiles.jsonl row, checked by ProfileRow."""
    if "pass_" in fields:
        fields["pass"] = fields.pop("pass_")
    return _build("profiles", fields)


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    return f"{'.'.join(str(p) for p in err['loc']) or 'value'}: {err['msg'].removeprefix('Value error, ')}"


def _check(model: type[BaseModel], data: dict[str, Any], where: str) -> None:
    """model's check of data read from a file: one line naming `where` and the first field wrong."""
    try:
        model.model_validate(data)
    except ValidationError as exc:
        raise UserError(f"{where}: {_first_error(exc)} (file damaged)") from None


def read_manifest(data: Any, source: str) -> dict[str, Any]:
    """A manifest is a JSON object of a known version whose fields have the types its readers use
    (e2e/rundir/manifest_model.py)."""
    if not isinstance(data, dict):
        raise UserError(f"{source}: not a JSON object (file damaged)")
    v = data.get("schema_version")
    if v != VERSIONS["manifest"]:
        raise UserError(
            f"{source}: schema_version {v!r} but this harness reads {VERSIONS['manifest']}; "
            "use the harness version that wrote it"
        )
    return manifest_model.check(data, source)  # the fields every reader uses, typed


def read_plan(data: Any, source: str) -> list[dict[str, Any]]:
    """plan.json: a list of planned cells with unique cell ids."""
    if not isinstance(data, list):
        raise UserError(f"{source}: not a JSON list of cells (file damaged)")
    seen = set()
    for i, entry in enumerate(data, start=1):
        if not isinstance(entry, dict):
            raise UserError(f"{source}: entry {i} is {type(entry).__name__}, not an object (file damaged)")
        _check(PlanEntry, entry, f"{source}: entry {i}")
        if entry["cell_id"] in seen:
            raise UserError(f"{source}: cell {entry['cell_id']!r} is planned twice (file damaged)")
        seen.add(entry["cell_id"])
    return data


def read_voided(data: Any, source: str) -> dict[str, Any]:
    """A voided attempt's record (VoidedAttempt): one line naming the file and field otherwise."""
    if not isinstance(data, dict):
        raise UserError(f"{source}: not a JSON object (file damaged)")
    _check(VoidedAttempt, data, source)
    return data


def read_rows(kind: str, rows: list[Any], source: str) -> list[dict[str, Any]]:
    """Check rows read from a file of `kind`: each is a JSON object of a known version whose
    contract fields have the right types. One line naming the file, line and field otherwise."""
    want = VERSIONS[kind]
    model = ROW_MODELS[kind]
    for i, r in enumerate(rows, start=1):
        if not isinstance(r, dict):
            raise UserError(f"{source}: row {i} is {type(r).__name__}, not an object (file damaged)")
        v = r.get("schema_version")
        if v != want:
            raise UserError(
                f"{source}: row {i} has schema_version {v!r} but this harness reads {want}; "
                "use the harness version that wrote it"
            )
        _check(model, r, f"{source}: row {i}")
    return rows
