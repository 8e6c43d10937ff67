"""A round whose answers the server held past their decode: the stall that 64-vs-8 differencing
cannot see.

vLLM takes a request's e2e latency and its time to first token on the API server's clock and its
decode time on the engine core's (vllm/v1/metrics/stats.py), so for a request that ran undisturbed
e2e = TTFT + decode to a millisecond or two. On an H200 at 8K x 16 and 8K x 32 (results/h200-load-tp1)
the 8-token rounds of the fast arm carried 0.1-0.4 s more than that, the 64-token rounds none: the
server's processes stalled for a time that 64 decode steps outlast and 8 do not, so a short round
ended with the stall instead of its decode and the per-step estimate read low (12.6 ms/step against
the server's 14.9 and 19.6).

A round at c > 1 is refused when its requests' unexplained time (e2e - TTFT - decode, per-request
means over the round) exceeds line_steps of its own decode steps. A short round held by L steps moves
the estimate by at most L / (long - short) of a step, so the line is tied to the run's own lengths and
min effect: L = BIAS_SHARE x min effect x (long - short), a bias of at most half the min effect
(bias_bound_pct). At a 2 % min effect: 0.56 steps at 64 vs 8 tokens, 0.96 at 128 vs 32, 0.32 at 64 vs
32 (a fixed half step there allowed 1.6 %, against the 2 % it should resolve). On the committed H200
load runs (every row of requests.jsonl at c > 1) the rounds under the line stayed under 0.3 step (the
32K run under 0.06) and the 18 over it, all in results/h200-load-tp1, held 3.4 to 21 steps over every row (the
stalled rounds the analysis counts: 3.39 to 19.47, docs/concepts/load.md): the tie
moves none of their verdicts.

Runner (e2e/run/batch.round_problem) and reader (e2e/analysis/stalls.py) apply it at c > 1 only: at
batch 1 the rows are single requests, measured on either route. What it reads is the round's mean over
its c requests: vLLM's histograms give no single request's times, and the client's own spread across
the c answers (0.2-0.4 step at c >= 16 on the H200, in rounds with no stall) is its own jitter, too
large to stand in for the largest request's held time. A stall that held one request of c alone shows
as 1 / c of itself; one that held the server holds all c alike.
"""

from __future__ import annotations

from typing import Any

BIAS_SHARE = 0.5  # the most of the min effect a stall just under the line may bias the estimate by


def line_steps(n_long: int, n_short: int, min_effect_pct: float) -> float:
    """The unexplained time, in decode steps, above which a round is refused."""
    return BIAS_SHARE * min_effect_pct / 100 * (n_long - n_short)


def bias_bound_pct(n_long: int, n_short: int, line: float) -> float:
    """The most, in % of a step, that a short round held just under `line` steps moves the estimate."""
    return 100 * line / (n_long - n_short)


def unexplained_s(row: dict[str, Any]) -> float | None:
    """e2e - TTFT - decode of a round's requests (per-request means), or None where one is missing."""
    e2e, ttft, dec = (row.get(k) for k in ("server_e2e_s", "server_ttft_s", "server_decode_s"))
    if e2e is None or ttft is None or dec is None:
        return None
    return float(e2e - ttft - dec)


def stall_problem(row: dict[str, Any], n_tokens: int, line: float) -> str | None:
    """Why a round at c > 1 does not count because the server held its answers past `line` steps, or None."""
    gap, dec = unexplained_s(row), row.get("server_decode_s")
    if gap is None or dec is None or n_tokens < 2 or dec <= 0:
        return None
    step = dec / (n_tokens - 1)  # the first token is the prefill's; the rest are decode steps
    if gap <= line * step:
        return None
    return (
        f"the server held the answers {1e3 * gap:.0f} ms past TTFT + decode ({gap / step:.1f} steps, over the "
        f"{line:.2f}-step line): a stall {n_tokens} tokens do not outlast; raise workload.short_tokens"
    )
