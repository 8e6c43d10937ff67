"""Scrape vLLM's Prometheus `/metrics` and turn `_sum`/`_count` deltas into per-request times.

Requests are sent one at a time, so the delta of a histogram's sum across one request is that
request's value (the buckets are too coarse to use). Series are summed over their labels
(model name, engine index).

A scrape is read through e2e/safety/http_read.py: within the client's timeout in all and at most
METRICS_MAX_BYTES, on one keep-alive connection per client; whatever fails is an httpx.HTTPError,
as a request through the client itself would be.
"""

from __future__ import annotations

import http.client
import time
import weakref
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from e2e.safety.http_read import TooLarge, exchange, reopen_if_closed

# name in the row -> vLLM histogram
HISTOGRAMS = {
    "server_decode_s": "vllm:request_decode_time_seconds",
    "server_prefill_s": "vllm:request_prefill_time_seconds",
    "server_e2e_s": "vllm:e2e_request_latency_seconds",
    "server_ttft_s": "vllm:time_to_first_token_seconds",
    "server_queue_s": "vllm:request_queue_time_seconds",
}
WANTED = set(HISTOGRAMS.values())


@dataclass(frozen=True)
class Snapshot:
    sums: dict[str, float]
    counts: dict[str, float]


def parse(text: str) -> Snapshot:
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name not in WANTED:
            continue
        for s in fam.samples:
            if s.name.endswith("_sum"):
                sums[fam.name] = sums.get(fam.name, 0.0) + s.value
            elif s.name.endswith("_count"):
                counts[fam.name] = counts.get(fam.name, 0.0) + s.value
    return Snapshot(sums, counts)


METRICS_MAX_BYTES = 32 << 20  # vLLM's /metrics is a few hundred KB, per engine
_conns: weakref.WeakKeyDictionary[httpx.Client, http.client.HTTPConnection] = weakref.WeakKeyDictionary()


def scrape_text(client: httpx.Client) -> str:
    """/metrics of the server `client` talks to, as text."""
    url, timeout = client.base_url, client.timeout.read or 30.0
    conn = _conns.get(client)
    if conn is None:
        conn = _conns[client] = http.client.HTTPConnection(url.host, url.port, timeout=timeout)
    reopen_if_closed(conn)
    path = url.raw_path.decode().split("?")[0].rstrip("/") + "/metrics"
    auth = {"Authorization": client.headers["Authorization"]} if "Authorization" in client.headers else {}
    try:
        status, body = exchange(conn, "GET", path, None, auth, timeout, METRICS_MAX_BYTES)
    except (OSError, http.client.HTTPException, TooLarge) as exc:
        raise httpx.TransportError(f"/metrics: {exc}") from None
    if status != 200:
        raise httpx.HTTPError(f"/metrics: HTTP {status}")
    return body.decode("utf-8", "replace")


def scrape(client: httpx.Client) -> Snapshot:
    return parse(scrape_text(client))


def scrape_text_after(client: httpx.Client, before: Snapshot, n_requests: int = 1, timeout_s: float = 2.0) -> str:
    """/metrics as text, once the e2e histogram has counted the request(s) just finished (it is
    observed when a request is finalised, which can trail the HTTP response by a moment)."""
    key = HISTOGRAMS["server_e2e_s"]
    deadline = time.monotonic() + timeout_s
    while True:
        text = scrape_text(client)
        if parse(text).counts.get(key, 0) >= before.counts.get(key, 0) + n_requests:
            return text
        if time.monotonic() > deadline:
            return text
        time.sleep(0.005)


def scrape_after(client: httpx.Client, before: Snapshot, n_requests: int = 1, timeout_s: float = 2.0) -> Snapshot:
    return parse(scrape_text_after(client, before, n_requests, timeout_s))


def deltas(before: Snapshot, after: Snapshot, n_requests: int = 1) -> dict[str, float | None]:
    """Per-request server times: each histogram's sum over the n requests just finished, divided by
    n (n > 1: overlapping requests, whose own times cannot be told apart); None where the histogram
    did not count exactly n requests."""
    out: dict[str, float | None] = {}
    for field, name in HISTOGRAMS.items():
        dc = after.counts.get(name, 0) - before.counts.get(name, 0)
        total = after.sums.get(name, 0.0) - before.sums.get(name, 0.0)
        out[field] = total / n_requests if dc == n_requests else None
    return out
