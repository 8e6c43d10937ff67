"""Does the primed route agree with today's batch-1 design, and what does fresh-prompt differencing
read at c > 1? One server (prefix caching on, --max-num-seqs the largest c), each depth:

    c = 1, fresh prompts, one request at a time     today's estimator (measure.py)
    c = 1, primed prompt                            the route at batch 1 (batch.py)
    c > 1, primed prompts                           the route (batch.py)
    c > 1, fresh prompts every round                plain differencing: prefill interleaves

Prints per-step decode (median T_long - median T_short) / (long - short) in ms with the bootstrap
95 % interval, the rounds counted, and for fresh rounds at c > 1 why the route's checks would refuse
them. A benchmark that prints figures, not a test:

    python -m e2e.run.route_check --config configs/cpu-demo.toml --depths 256 --concurrency 1,4
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from e2e.design.config import load_config
from e2e.run.batch import BatchClient, measure_batch_cell, round_problem
from e2e.run.measure import CellClient, TokenSampler, measure_cell
from e2e.serve.launch import server_spec, session_api_key
from e2e.serve.server import VllmServer
from e2e.stats.cells import cell_stats
from e2e.stats.stall import line_steps


def _fresh_rounds(
    client: BatchClient, sampler: TokenSampler, depth: int, long_: int, short: int, rounds: int, line: float
) -> list[dict[str, Any]]:
    rows = []
    for rnd in range(rounds):
        for n in (long_, short) if rnd % 2 == 0 else (short, long_):
            row = client.round([sampler.prompt(depth) for _ in range(client.c)], n, depth)
            why = round_problem(row, client.c, n, depth, client.kv["block_size"] if client.kv else None, line)
            rows.append({"n_tokens": n, "round": rnd, **row, "valid": True, "why_refused": why})
    return rows


def _line(label: str, rows: list[dict[str, Any]], long_: int, short: int) -> str:
    cs = cell_stats(rows, long_, short)
    ci = f"{cs.ci[0]:.2f} to {cs.ci[1]:.2f}" if cs.ci is not None else "no interval"
    est = f"{cs.estimate:.2f}" if cs.estimate is not None else "-"
    refused = sum(1 for r in rows if r.get("why_refused") or not r["valid"])
    return f"  {label:<34} {est:>9} ms/step  ({ci}; {len(rows) // 2} rounds, {refused} rows the checks refuse)"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m e2e.run.route_check", description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--depths", help="comma-separated; default: the config's")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--log", help="the server's log; default: a file in the system's temp folder (printed)")
    a = ap.parse_args(argv)
    cs = sorted({int(x) for x in a.concurrency.split(",")})
    cfg = load_config(a.config, {"workload.concurrency": [max(cs)], "workload.rounds": a.rounds})
    depths = [int(x) for x in a.depths.split(",")] if a.depths else list(cfg.workload.depths)
    wl, arm, me = cfg.workload, cfg.arms[0], cfg.stats.min_effect_pct
    sampler = TokenSampler.for_model(cfg.model.path, wl.seed, cfg.model.vocab_size)
    spec = server_spec(cfg, arm, None)
    # Never the working folder: a log there ends up committed by whoever runs this from the repo.
    log = Path(a.log) if a.log else Path(tempfile.mkstemp(prefix="route_check.", suffix=".server.log")[1])
    print(f"server log: {log}")
    with VllmServer(spec, log, cfg.server.startup_timeout_s, cfg.server.stop_timeout_s, api_key=session_api_key()) as s:
        print(f"server up in {s.startup_s:.0f} s ({' '.join(spec.argv(0)[3:])})")
        for d in depths:
            print(f"depth {d}:")
            one = CellClient(s.base_url, s.api_key, cfg.server.request_timeout_s)
            res = measure_cell(one, d, wl, sampler, emit=lambda r: None, phase=lambda p: None)
            one.close()
            print(_line("c = 1, fresh (today's estimator)", res.rows, wl.long_tokens, wl.short_tokens))
            for c in cs:
                b = BatchClient(s.base_url, s.api_key, cfg.server.request_timeout_s, c)
                try:
                    res = measure_batch_cell(
                        b, d, wl, sampler, emit=lambda r: None, phase=lambda p: None, min_effect_pct=me
                    )
                    print(_line(f"c = {c}, primed (the route)", res.rows, wl.long_tokens, wl.short_tokens))
                    if c > 1:
                        rows = _fresh_rounds(
                            b,
                            sampler,
                            d,
                            wl.long_tokens,
                            wl.short_tokens,
                            wl.rounds,
                            line_steps(wl.long_tokens, wl.short_tokens, me),
                        )
                        print(_line(f"c = {c}, fresh prompts every round", rows, wl.long_tokens, wl.short_tokens))
                finally:
                    b.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
