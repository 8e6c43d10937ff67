"""A cell's requests: warm-up, timed rounds, exact-length prompts, validation.

Each round sends one long (e.g. 64-token) and one short (8-token) generation over a fresh random
token-id prompt of exactly `depth` tokens, alternating which goes first. Only the HTTP call is
timed; the `/metrics` scrapes that give the server's own times happen outside the timed region.
"""

from __future__ import annotations

import http.client
import json
import select
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import httpx
import numpy as np

from e2e.design.config import WorkloadCfg
from e2e.errors import UserError
from e2e.run import metrics
from e2e.rundir.formats import MeasuredRow
from e2e.safety.http_read import ANSWER_MAX_BYTES as ANSWER_MAX
from e2e.safety.http_read import TooLarge, exchange, get
from e2e.serve.server import SERVED_NAME, ServerGone

HEALTH_TIMEOUT_S = 5.0  # the whole /health exchange, asked after a 5xx: is the engine still there?
HEALTH_MAX_BYTES = 1 << 16  # vLLM answers an empty body


class TokenSampler:
    """Random prompts of exact length from ids the tokenizer knows, never its special tokens."""

    def __init__(self, vocab_size: int, excluded: set[int], seed: int):
        ids = np.setdiff1d(np.arange(vocab_size), np.fromiter(excluded, dtype=np.int64, count=len(excluded)))
        if ids.size < 100:
            raise UserError(f"tokenizer leaves only {ids.size} usable token ids")
        self.ids = ids
        self.rng = np.random.default_rng(seed)

    def prompt(self, depth: int) -> list[int]:
        ids: list[int] = self.rng.choice(self.ids, size=depth).tolist()
        return ids

    @classmethod
    def for_model(cls, model_path: str, seed: int, vocab_size: int | None = None) -> TokenSampler:
        folder = Path(model_path)
        excluded: set[int] = set()
        sizes = [vocab_size] if vocab_size else []
        cfg_file = folder / "config.json"
        if cfg_file.is_file():
            cfg = json.loads(cfg_file.read_text())
            v = cfg.get("vocab_size") or cfg.get("text_config", {}).get("vocab_size")
            if v:
                sizes.append(int(v))
        tok_file = folder / "tokenizer.json"
        if tok_file.is_file():
            tok = json.loads(tok_file.read_text())
            excluded = {int(t["id"]) for t in tok.get("added_tokens", [])}
            vocab = tok.get("model", {}).get("vocab")
            if vocab:
                sizes.append(len(vocab))
        if not sizes:
            raise UserError(
                f"model.path {model_path!r} is not a local model folder (no config.json); "
                "give a local folder or set model.vocab_size"
            )
        # Low ids hold control/byte tokens in most vocabularies: start past them when there is room.
        n = min(sizes)
        excluded |= set(range(min(256, n // 100)))
        return cls(n, excluded, seed)


@dataclass
class CellResult:
    rows: list[dict[str, Any]]
    warmup_s: float
    measure_s: float
    warmup_valid: bool
    stopped_by: str  # "rounds" | "target_ci" | "max_rounds"


def check_row(row: dict[str, Any], depth: int, n: int) -> str | None:
    """Why a row is not usable, or None. The server's own usage is the only count that matters."""
    if row.get("error"):
        error: str = row["error"]
        return error
    if row.get("prompt_tokens") != depth:
        return f"prompt_tokens {row.get('prompt_tokens')} != depth {depth}"
    if row.get("completion_tokens") != n:
        return f"completion_tokens {row.get('completion_tokens')} != {n}"
    if row.get("finish_reason") != "length":
        return f"finish_reason {row.get('finish_reason')!r} != 'length'"
    return None


class CellClient:
    """HTTP to one server: completions with exact lengths, plus metric snapshots around them."""

    def __init__(self, base_url: str, api_key: str, request_timeout_s: float):
        self.http = httpx.Client(
            base_url=base_url, timeout=request_timeout_s, headers={"Authorization": f"Bearer {api_key}"}
        )
        # The timed request uses the standard library's http.client on its own keep-alive connection:
        # at 32K tokens (a ~180 KB body) it costs ~0.4 ms less client CPU per request than httpcore
        # (httpx's transport), and httpx's own models ~1 ms more (python -m e2e.run.bench_overhead).
        url = urlsplit(base_url)
        self._base_url, self._auth = base_url, {"Authorization": f"Bearer {api_key}"}
        self._conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=request_timeout_s)
        self._timeout_s = request_timeout_s
        self._path = url.path.rstrip("/") + "/v1/completions"
        self._headers = {**self._auth, "Content-Type": "application/json"}
        self._snap: metrics.Snapshot | None = None

    def resync(self) -> None:
        """Forget the /metrics baseline, after requests that this client did not send."""
        self._snap = None

    def close(self) -> None:
        self._conn.close()
        self.http.close()

    def _drop_if_closed_by_server(self) -> None:
        """An idle keep-alive connection that reads as ready has been closed by the server (uvicorn
        closes after 5 s idle): reconnect instead of sending into it, as httpx's pool does."""
        sock = self._conn.sock
        if sock is not None and select.select([sock], [], [], 0)[0]:
            self._conn.close()

    def healthy(self) -> bool:
        """/health answers 200 within HEALTH_TIMEOUT_S in all (a trickled answer is cut there)."""
        try:
            status, _ = get(self._base_url, "/health", self._auth, HEALTH_TIMEOUT_S, HEALTH_MAX_BYTES)
        except (OSError, http.client.HTTPException, TooLarge):
            return False
        return status == 200

    def complete(self, prompt: list[int], n: int) -> dict[str, Any]:
        # Encoded before the clock starts, without spaces: a 32K-token prompt is ~180 KB of JSON.
        body = json.dumps(
            {
                "model": SERVED_NAME,
                "prompt": prompt,
                "max_tokens": n,
                "min_tokens": n,
                "ignore_eos": True,
                "temperature": 0.0,
            },
            separators=(",", ":"),
        ).encode()
        try:
            before = self._snap or metrics.scrape(self.http)
        except httpx.HTTPError as exc:
            raise ServerGone(f"/metrics: {exc!r}") from None
        self._drop_if_closed_by_server()
        row: dict[str, Any] = {"t_start_unix": time.time()}
        t0 = time.perf_counter()
        try:  # within request_timeout_s in all, the body bounded (e2e/safety/http_read.py)
            status, content = exchange(self._conn, "POST", self._path, body, self._headers, self._timeout_s, ANSWER_MAX)
            t1 = time.perf_counter()
        except TimeoutError:
            self._conn.close()  # a late answer must not be read as the next request's
            self._snap = None
            return {**row, "t_client_s": None, "error": "request timed out"}
        except TooLarge as exc:
            self._snap = None
            return {**row, "t_client_s": None, "error": f"response: {exc}"}
        except (OSError, http.client.HTTPException) as exc:
            self._conn.close()
            raise ServerGone(f"request failed: {exc!r}") from None
        row["t_client_s"] = t1 - t0
        if status != 200:
            self._snap = None
            if status >= 500 and not self.healthy():
                raise ServerGone(f"HTTP {status} and /health fails: the engine is gone")
            return {**row, "error": f"HTTP {status}: {content[:200].decode(errors='replace')}"}
        try:
            data = json.loads(content)
        except ValueError:
            return {**row, "error": f"response is not JSON: {content[:200]!r}"}
        usage = data.get("usage") or {}
        choice = (data.get("choices") or [{}])[0]
        row.update(
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            finish_reason=choice.get("finish_reason"),
        )
        try:
            after = metrics.scrape_after(self.http, before)
        except httpx.HTTPError as exc:
            raise ServerGone(f"/metrics: {exc!r}") from None
        row.update(metrics.deltas(before, after))
        self._snap = after
        return row


def measure_cell(
    client: CellClient,
    depth: int,
    wl: WorkloadCfg,
    sampler: TokenSampler,
    emit: Callable[[MeasuredRow], None],
    phase: Callable[[str], None],
    stop_rule: Callable[[list[dict[str, Any]]], bool] | None = None,
    between_rounds: Callable[[int], None] | None = None,
) -> CellResult:
    """Warm the depth, then time rounds. `emit` receives each timed row as soon as it exists.
    `between_rounds(k)` runs once k rounds are done (k = 0: after warm-up), never inside a timed
    request: the GPU checks (e2e/gpu/gpu_state.py) sample there, and may raise to end the cell."""

    def one(n: int) -> tuple[dict[str, Any], str | None]:
        row = client.complete(sampler.prompt(depth), n)
        return row, check_row(row, depth, n)

    return run_rounds(wl, one, emit, phase, stop_rule, between_rounds)


def run_rounds(
    wl: WorkloadCfg,
    one: Callable[[int], tuple[dict[str, Any], str | None]],
    emit: Callable[[MeasuredRow], None],
    phase: Callable[[str], None],
    stop_rule: Callable[[list[dict[str, Any]]], bool] | None = None,
    between_rounds: Callable[[int], None] | None = None,
    started: float | None = None,
    warm_ok: bool = True,
) -> CellResult:
    """Warm-up, then timed rounds of a long and a short length in alternating order, until
    workload.rounds (and the stop rule, up to max_rounds). `one(n)` sends what a round sends at
    length n (one request, or c of them: e2e/run/batch.py) and returns its row and why it does not
    count. `started`: when warming began, if work before the warm-up rounds belongs to it."""
    between = between_rounds or (lambda k: None)
    phase("warming")
    t0 = time.monotonic() if started is None else started
    for _ in range(wl.warmup_rounds):
        for n in (wl.long_tokens, wl.short_tokens):
            warm_ok &= one(n)[1] is None
    warmup_s = time.monotonic() - t0
    between(0)

    phase("measuring")
    t1 = time.monotonic()
    rows: list[dict[str, Any]] = []
    stopped_by = "rounds"
    rnd = 0
    while True:
        pair = (wl.long_tokens, wl.short_tokens) if rnd % 2 == 0 else (wl.short_tokens, wl.long_tokens)
        for pos, n in enumerate(pair):
            row, reason = one(n)
            row = {
                "n_tokens": n,
                "round": rnd,
                "position": pos,
                **row,
                "valid": reason is None,
                "invalid_reason": reason,
            }
            rows.append(row)
            emit(cast(MeasuredRow, row))  # the fields MeasuredRow names: the round's, and complete()'s
        rnd += 1
        between(rnd)
        if rnd < wl.rounds:
            continue
        if stop_rule is None:
            break
        if stop_rule(rows):
            stopped_by = "target_ci"
            break
        if rnd >= wl.max_rounds:
            stopped_by = "max_rounds"
            break
    return CellResult(rows, warmup_s, time.monotonic() - t1, warm_ok, stopped_by)
