"""Rounds at concurrency c > 1: c simultaneous requests of one length over c primed prompts.

The route ("primed"): the server runs with prefix caching on. A cell draws c distinct random
prompts of exactly `depth` tokens once, prefills them with one-token requests before anything is
timed, and reuses them in every round, so a timed round's prefill is only the last, uncached block
of each prompt and every decode step of the round runs the c requests together. Fresh prompts
cannot do this at c > 1: beyond a few thousand tokens of c x depth the last request is still
prefilling (chunked prefill) while the first ones decode, and 64-vs-8 differencing then reads
prefill-mixed steps (+11 % at 8K x 16 on an H200; far more on a CPU).

A round's row (requests.jsonl) stands for all c requests: `t_client_s` is the round's span, from the
first request sent to the last answer read, so the cell's estimate (median T64 - median T8) / 56 is
the time of one decode step at batch c. `requests` holds each request's own time and usage; the
server's facts around the round come from /metrics (`server`: engine steps, tokens scheduled,
prefix-cache queries and hits, preemptions); `server_*_s` are the per-request means of the summed
histograms (requests overlap, so no single request's time can be told apart).

A round counts only if every request is valid (the same usage checks as at batch 1), no request was
preempted, the prefix cache served every prompt but its last block, the engine ran at most
n + STEP_SLACK steps (c requests that really decoded together take n steps; c that did not overlap
take up to c x n), and the server did not hold the answers past their decode (e2e/stats/stall.py).
"""

from __future__ import annotations

import http.client
import json
import select
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import httpx
from prometheus_client.parser import text_string_to_metric_families

from e2e.design.config import WorkloadCfg
from e2e.run import metrics
from e2e.run.measure import CellResult, TokenSampler, check_row, run_rounds
from e2e.rundir.formats import MeasuredRow
from e2e.safety.http_read import ANSWER_MAX_BYTES as ANSWER_MAX
from e2e.safety.http_read import TooLarge, exchange
from e2e.serve.server import SERVED_NAME, ServerGone
from e2e.stats import stall

ROUTE = "primed"
STEP_SLACK = 2  # engine steps beyond n a round may take: requests that arrive a step or two apart
# /metrics counters and histograms read around a round (summed over labels), by the key in `server`
COUNTERS = {
    "prefix_queries": "vllm:prefix_cache_queries",
    "prefix_hits": "vllm:prefix_cache_hits",
    "preemptions": "vllm:num_preemptions",
}
STEPS = "vllm:iteration_tokens_total"  # a histogram observed once per engine step: its count is the steps


def server_facts(text: str) -> dict[str, float]:
    """Counters, engine steps and tokens scheduled from one /metrics scrape."""
    out: dict[str, float] = {}
    totals = {f"{name}_total": key for key, name in COUNTERS.items()}
    for fam in text_string_to_metric_families(text):
        # a counter's family is named with or without _total (by the exposition's TYPE line); its samples with
        for s in fam.samples:
            if s.name in totals:
                out[totals[s.name]] = out.get(totals[s.name], 0.0) + s.value
        if fam.name == STEPS:
            for s in fam.samples:
                if s.name.endswith("_count"):
                    out["steps"] = out.get("steps", 0.0) + s.value
                elif s.name.endswith("_sum"):
                    out["tokens"] = out.get("tokens", 0.0) + s.value
    return out


def kv_cache(text: str) -> dict[str, int] | None:
    """The server's KV cache as vLLM states it (`vllm:cache_config_info` labels): block size and
    blocks, so capacity in tokens. None where the server does not say."""
    for fam in text_string_to_metric_families(text):
        if fam.name == "vllm:cache_config_info":
            for s in fam.samples:
                try:
                    block, blocks = int(s.labels["block_size"]), int(s.labels["num_gpu_blocks"])
                except (KeyError, ValueError):
                    continue
                return {"block_size": block, "blocks": blocks, "tokens": block * blocks}
    return None


def cached_tokens(depth: int, block: int) -> int:
    """What the prefix cache can serve of a prompt it holds: every full block but the one that holds
    the last token (vLLM computes at least that token again)."""
    return (depth - 1) // block * block


# Seen on an H200 (Gemma 3 at 32K x 4): the hybrid KV-cache manager frees every block that leaves a
# sliding window while a prompt prefills, so priming c long prompts cycles the pool and evicts the first.
EVICTED_HINT = (
    " (with sliding-window layers, vLLM's hybrid KV-cache manager churns the cache: server.extra_args "
    "['--disable-hybrid-kv-cache-manager'] keeps primed prompts; docs/concepts/load.md)"
)


def round_problem(row: dict[str, Any], c: int, n: int, depth: int, block: int | None, stall_line: float) -> str | None:
    """Why a round at concurrency c does not count, or None (stall_line: e2e/stats/stall.line_steps)."""
    bad = [r for r in row["requests"] if r["invalid_reason"]]
    if bad:
        return f"{len(bad)} of {c} request(s): {bad[0]['invalid_reason']}"
    s = row["server"]
    if s.get("steps") is None:
        return "the server's /metrics has no engine-step histogram (vllm:iteration_tokens_total)"
    if s["steps"] > n + STEP_SLACK:
        return f"{s['steps']:.0f} engine steps for {n} tokens: the {c} requests did not decode together"
    if s.get("preemptions"):
        return f"{s['preemptions']:.0f} preemption(s) during the round"
    if c > 1 and (
        stalled := stall.stall_problem(row, n, stall_line)
    ):  # at c > 1, as the reader applies it (analysis/stalls.py)
        return stalled
    if block is not None and s.get("prefix_hits") is not None:
        need = c * cached_tokens(depth, block)
        if s["prefix_hits"] < need:
            return (
                f"prefix cache served {s['prefix_hits']:.0f} of {need} primed prompt tokens: a prompt was prefilled "
                f"again{EVICTED_HINT}"
            )
    return None


class BatchClient:
    """c keep-alive connections to one server, each request on its own thread, started together."""

    def __init__(self, base_url: str, api_key: str, request_timeout_s: float, concurrency: int):
        self.c = concurrency
        self.http = httpx.Client(
            base_url=base_url, timeout=request_timeout_s, headers={"Authorization": f"Bearer {api_key}"}
        )
        url = urlsplit(base_url)
        self._addr = (url.hostname or "127.0.0.1", url.port, request_timeout_s)
        self._path = url.path.rstrip("/") + "/v1/completions"
        self._headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="round")
        self._conns: list[http.client.HTTPConnection] = []
        self.kv: dict[str, int] | None = None

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for conn in self._conns:
            conn.close()
        self.http.close()

    def capacity_problem(self, depth: int, long_tokens: int) -> str | None:
        """Why the server cannot hold a round of c requests of depth + long_tokens, or None (also
        where it does not state its KV cache: then a preemption during a round flags the round)."""
        self.kv = self.kv or kv_cache(self.scrape())
        if self.kv is None:
            return None
        block, blocks = self.kv["block_size"], self.kv["blocks"]
        need = self.c * -(-(depth + long_tokens) // block)
        if need <= blocks:
            return None
        return (
            f"not measured: {self.c} x (depth {depth} + {long_tokens} tokens) needs {need} KV-cache blocks of "
            f"{block} tokens; the server has {blocks} ({self.kv['tokens']} tokens)"
        )

    def scrape(self) -> str:
        try:
            return metrics.scrape_text(self.http)
        except httpx.HTTPError as exc:
            raise ServerGone(f"/metrics: {exc!r}") from None

    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        # An idle keep-alive connection that reads as ready was closed by the server (uvicorn closes
        # after 5 s idle): reconnect rather than send into it (as measure.CellClient does).
        if conn is not None and conn.sock is not None and select.select([conn.sock], [], [], 0)[0]:
            conn.close()
        if conn is None:
            host, port, timeout = self._addr
            conn = self._local.conn = http.client.HTTPConnection(host, port, timeout=timeout)
            self._conns.append(conn)
        return conn

    def _one(self, body: bytes, start: threading.Barrier) -> dict[str, Any]:
        conn = self._conn()
        start.wait()
        t0 = time.perf_counter()
        try:  # within request_timeout_s in all, the body bounded (e2e/safety/http_read.py)
            status, content = exchange(conn, "POST", self._path, body, self._headers, self._addr[2], ANSWER_MAX)
        except TimeoutError:
            conn.close()
            return {"t0": t0, "t1": None, "error": "request timed out"}
        except TooLarge as exc:
            return {"t0": t0, "t1": None, "error": f"response: {exc}"}
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            return {"t0": t0, "t1": None, "error": f"request failed: {exc!r}", "gone": True}
        t1 = time.perf_counter()
        if status != 200:
            return {"t0": t0, "t1": t1, "error": f"HTTP {status}: {content[:200].decode(errors='replace')}"}
        try:
            data = json.loads(content)
        except ValueError:
            return {"t0": t0, "t1": t1, "error": f"response is not JSON: {content[:200]!r}"}
        usage, choice = data.get("usage") or {}, (data.get("choices") or [{}])[0]
        return {
            "t0": t0,
            "t1": t1,
            "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage.get("completion_tokens"),
            "finish_reason": choice.get("finish_reason"),
        }

    def send(self, prompts: list[list[int]], n: int) -> list[dict[str, Any]]:
        """The c requests at once (a barrier releases them together); each one's times and usage."""
        bodies = [
            json.dumps(
                {
                    "model": SERVED_NAME,
                    "prompt": p,
                    "max_tokens": n,
                    "min_tokens": n,
                    "ignore_eos": True,
                    "temperature": 0.0,
                },
                separators=(",", ":"),
            ).encode()
            for p in prompts
        ]
        start = threading.Barrier(len(bodies))
        out = [f.result() for f in [self._pool.submit(self._one, b, start) for b in bodies]]
        if any(o.get("gone") for o in out):
            raise ServerGone(next(o["error"] for o in out if o.get("gone")))
        return out

    def round(self, prompts: list[list[int]], n: int, depth: int) -> dict[str, Any]:
        """One timed round of c requests of n tokens, with the server's facts around it."""
        text = self.scrape()
        if self.kv is None:
            self.kv = kv_cache(text)
        before, hist = server_facts(text), metrics.parse(text)
        sent = self.send(prompts, n)
        after_text = self.scrape_after(hist, len(prompts))
        after = server_facts(after_text)
        requests = []
        for o in sent:
            req = {k: o.get(k) for k in ("prompt_tokens", "completion_tokens", "finish_reason", "error")}
            req["t_client_s"] = None if o["t1"] is None else o["t1"] - o["t0"]
            requests.append({**req, "invalid_reason": check_row(req, depth, n)})
        done = [o["t1"] for o in sent if o["t1"] is not None]
        span = max(done) - min(o["t0"] for o in sent) if len(done) == len(sent) else None
        server = {k: after[k] - before.get(k, 0.0) for k in after}
        row: dict[str, Any] = {"t_client_s": span, "requests": requests, "server": server}
        row.update(metrics.deltas(hist, metrics.parse(after_text), len(prompts)))
        return row

    def scrape_after(self, before: metrics.Snapshot, n_requests: int) -> str:
        """The first scrape whose e2e histogram has counted all n requests (it can trail the answers)."""
        try:
            return metrics.scrape_text_after(self.http, before, n_requests)
        except httpx.HTTPError as exc:
            raise ServerGone(f"/metrics: {exc!r}") from None


def measure_batch_cell(
    client: BatchClient,
    depth: int,
    wl: WorkloadCfg,
    sampler: TokenSampler,
    emit: Callable[[MeasuredRow], None],
    phase: Callable[[str], None],
    stop_rule: Callable[[list[dict[str, Any]]], bool] | None = None,
    between_rounds: Callable[[int], None] | None = None,
    *,
    min_effect_pct: float,
) -> CellResult:
    """measure_cell's contract at concurrency client.c: prime the cell's c prompts, warm, then time
    rounds (one row per round and length). `between_rounds(k)` as in measure_cell; min_effect_pct: the
    run's, for the stall check's line (e2e/stats/stall.py)."""
    c = client.c
    line = stall.line_steps(wl.long_tokens, wl.short_tokens, min_effect_pct)
    prompts = [sampler.prompt(depth) for _ in range(c)]
    phase("priming")
    t0 = time.monotonic()
    primed = client.send(prompts, 1)

    def one(n: int) -> tuple[dict[str, Any], str | None]:
        row = client.round(prompts, n, depth)
        return row, round_problem(row, c, n, depth, client.kv["block_size"] if client.kv else None, line)

    warm_ok = all(check_row(o, depth, 1) is None for o in primed)
    return run_rounds(wl, one, emit, phase, stop_rule, between_rounds, started=t0, warm_ok=warm_ok)
