"""Constructed rows and run folders for tests that need no server: a cell's timed rows, its
statistics, a variance-model design, and a whole run folder as the runner writes it."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from e2e.design.config import config_to_dict, parse_config
from e2e.design.plan import make_plan
from e2e.rundir.store import CELLS, REQUESTS, RunStore
from e2e.stats import cells as stats
from e2e.stats import changepoints as cp

L, S = 64, 8


def rows_for(tpt_ms, rounds=8, prefill_s=0.5, noise=0.0, seed=0, invalid=()):
    """Timed rows as measure.py writes them: one long and one short per round."""
    rng = np.random.default_rng(seed)
    out = []
    for r in range(rounds):
        for pos, n in enumerate((L, S) if r % 2 == 0 else (S, L)):
            t = prefill_s + n * tpt_ms / 1e3 + rng.normal(0, noise)
            srv = (n - 1) * tpt_ms / 1e3
            ok = (r, n) not in invalid
            out.append(
                {
                    "n_tokens": n,
                    "round": r,
                    "position": pos,
                    "t_client_s": t,
                    "valid": ok,
                    "invalid_reason": None if ok else "finish_reason 'stop' != 'length'",
                    "server_decode_s": srv,
                    "server_e2e_s": t - 0.001,
                }
            )
    return out


def cs(tpt_ms, **kw):
    return stats.cell_stats(rows_for(tpt_ms, **kw), L, S)


def quiet(t: float) -> stats.CellStats:
    return cp._as_cell(math.log(t))


def per_arm_pass(rng, arms=("a", "b"), k=4, depths=(1, 2, 3), sd_server=0.05, sd_cell=0.02, noise=None):
    """Cells of k servers per arm, each serving every depth: (arm, depth, server, CellStats)."""
    out = []
    for a in arms:
        for s in range(k):
            u = rng.normal(0, sd_server)
            for d in depths:
                if noise is None:
                    c = quiet(10.0 * d * math.exp(u + rng.normal(0, sd_cell)))
                else:
                    c = cs(
                        10.0 * d * math.exp(u + rng.normal(0, sd_cell)),
                        rounds=8,
                        noise=noise,
                        seed=int(rng.integers(1e9)),
                    )
                out.append((a, d, f"{a}{s}", c))
    return out


def make_run(
    root: Path,
    speeds: dict[str, float],
    depths=(1024, 8192),
    passes=2,
    seed=0,
    failed=(),
    missing=(),
    twin_of=None,
    vllm="0.26.0",
    gpu="NVIDIA H200",
    started="2026-11-29T10:00:00",
    model="gemma-3-27b-it-w4a16",
    dead_attempt=None,
    between=0.01,
    row_extra=None,
) -> Path:
    """A run folder as the runner writes it. speeds: arm -> ms/token at the smallest depth (grows
    5 % per depth step); each cell (server) is off by a relative normal(0, between).
    failed / missing: cell ids recorded as failed / never run. row_extra: cell id -> fields added to
    that cell's row (a bookend, a GPU state)."""
    arms = list(speeds)
    cfg = parse_config(
        {
            "name": "t",
            "model": {"path": model, "twin_of": twin_of},
            "server": {"tensor_parallel_size": 2},
            "workload": {"depths": list(depths), "long_tokens": L, "short_tokens": S, "rounds": 6},
            "run": {"order": "both", "passes": passes},
            "arms": [{"name": a} for a in arms],
        }
    )
    cells = make_plan(cfg)
    store = RunStore.create(root)
    rng = np.random.default_rng(seed)
    with store:
        store.write_manifest(
            {
                "schema_version": 1,
                "run_id": root.name,
                "started": started,
                "ended": started,
                "status": "complete",
                "config": config_to_dict(cfg),
                "server_mode": "fresh",
                "model": {"path": model, "twin_of": twin_of},
                "arms": {a: {"installation": {"vllm": vllm}} for a in arms},
                "gpu": {"nvidia_smi": [{"name": gpu, "driver": "580", "memory": "141 GB"}]} if gpu else {},
                "git": {"commit": "abc", "dirty": False},
            }
        )
        store.write_plan([c.to_dict() for c in cells])
        store.save_model_config(model)  # as a run does: a local model folder's config.json
        for c in cells:
            if c.cell_id in missing:
                continue
            base = {"cell_id": c.cell_id, "attempt": f"0-{c.index}", "pass": c.pass_, "arm": c.arm, "depth": c.depth}
            if c.cell_id == dead_attempt:  # an interrupted attempt: its rows must never count
                for r in range(6):
                    for n in (L, S):
                        store.append(
                            REQUESTS,
                            {
                                **base,
                                "attempt": "dead",
                                "n_tokens": n,
                                "round": r,
                                "t_client_s": 99.0 * n,
                                "valid": True,
                            },
                        )
            if c.cell_id in failed:
                store.append(CELLS, {**base, "status": "failed", "error": "server did not start"})
                continue
            tpt = speeds[c.arm] * 1.05 ** sorted(depths).index(c.depth) * (1 + rng.normal(0, between))
            for r in range(6):
                for n in (L, S):
                    t = 0.2 + n * tpt / 1e3 + rng.normal(0, 0.0005)
                    store.append(
                        REQUESTS,
                        {
                            **base,
                            "n_tokens": n,
                            "round": r,
                            "position": 0,
                            "t_client_s": t,
                            "valid": True,
                            "invalid_reason": None,
                            "server_decode_s": (n - 1) * tpt / 1e3,
                        },
                    )
            store.append(
                CELLS,
                {
                    **base,
                    "status": "ok",
                    "stopped_by": "rounds",
                    "startup_s": 100.0,
                    "server_key": c.server_key,
                    "routing": {
                        "n_processes": 5,
                        "layer_classes": [
                            {
                                "layer_class": "TritonAttentionImpl h128",
                                "n_layers": 10,
                                "path": "forward:TritonAttentionImpl",
                                "processes": ["Worker pid 7"],
                            }
                        ],
                    },
                    **((row_extra or {}).get(c.cell_id) or {}),
                },
            )
    return root
