"""Scrape vLLM's Prometheus `/metrics` and turn `_sum`/`_count` deltas into per-request times.

Requests are sent one at a time, so the delta of a histogram's sum across one request is that
request's value (the buckets are too coarse to use). Series are summed over their labels
(model name, engine index).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

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


def scrape(client: httpx.Client) -> Snapshot:
    r = client.get("/metrics")
    r.raise_for_status()
    return parse(r.text)


def scrape_after(client: httpx.Client, before: Snapshot, n_requests: int = 1, timeout_s: float = 2.0) -> Snapshot:
    """Scrape until the e2e histogram has counted the request(s) just finished (it is observed
    when the request is finalised, which can trail the HTTP response by a moment)."""
    key = HISTOGRAMS["server_e2e_s"]
    deadline = time.monotonic() + timeout_s
    while True:
        snap = scrape(client)
        if snap.counts.get(key, 0) >= before.counts.get(key, 0) + n_requests:
            return snap
        if time.monotonic() > deadline:
            return snap
        time.sleep(0.005)


def deltas(before: Snapshot, after: Snapshot) -> dict[str, float | None]:
    """Per-request server times; None where the histogram did not count exactly one request."""
    out: dict[str, float | None] = {}
    for field, name in HISTOGRAMS.items():
        dc = after.counts.get(name, 0) - before.counts.get(name, 0)
        out[field] = (after.sums.get(name, 0.0) - before.sums.get(name, 0.0)) if dc == 1 else None
    return out
