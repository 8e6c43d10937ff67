"""`run --dry-run`: the run's validation and its plan. It prints the cells (a table, or JSON with
--json), what each arm's servers run (interpreter, vLLM, patches, env and argv, secrets redacted; for a
Gemma 3, the attention backend its release serves it with on ROCm and whether that asks the gate),
the gsm8k step, what the plan should resolve and what it costs (predicted from earlier runs:
e2e/analysis/prior.py, e2e/cli/plan_cost.py), then exits 2 with one line per problem when the run
would refuse it (e2e/run/preflight.py: the same check the run makes before its first server)."""

from __future__ import annotations

import json
from typing import Any

from rich.text import Text

from e2e.design.config import Config, batch_warnings
from e2e.design.plan import Cell, plan_table_rows
from e2e.design.point import Point
from e2e.report.progress import make_console
from e2e.run.preflight import Preflight


def print_plan(cfg: Config, cells: list[Cell], as_json: bool, found: Preflight) -> int:
    """Exit 0, or UserError naming every problem (after the plan: what it is is worth seeing too)."""
    if as_json:
        print(json.dumps([c.to_dict() for c in cells], indent=1))
        found.refuse()
        return 0
    from rich.table import Table

    t = Table(title=f"plan: {cfg.name} ({len(cells)} cells, server mode {cfg.server.mode})")
    for col in ("index", "pass", "arm", "point", "cell_id"):
        t.add_column(col)
    for r in plan_table_rows(cells):
        t.add_row(*r)
    console = make_console()
    console.print(t)
    _arms(console, found)
    for w in batch_warnings(cfg):
        _say(console, w)
    _gsm8k(console, found)
    _profile(console, cfg)
    _prediction(console, cfg, cells)
    found.refuse()
    _say(console, "checks: nothing the run would refuse (what only a running server shows is not checked)")
    return 0


def _say(console: Any, line: str) -> None:
    """A line of data: never read as markup, never broken (an argv is copied from it)."""
    console.print(Text(line), soft_wrap=True)


def _arms(console: Any, found: Preflight) -> None:
    for a in found.arms:
        _say(console, f"arm {a.name}: {a.python} (vLLM: {a.vllm})")
        _say(console, f"  patches: {', '.join(a.patches) or 'none'}")
        _say(console, f"  inert check: {a.inert_check}")
        env = " ".join(f"{k}={v}" for k, v in a.env.items())
        _say(
            console, f"  env: {env or 'none'} (the harness adds its own: the plugin's, the API key, the compile cache)"
        )
        _say(console, f"  argv: {a.argv}")
        if a.rocm:  # a Gemma 3: whether this arm's release reaches the gate on ROCm (docs/concepts/rocm-backends.md)
            _say(console, f"  {a.rocm}")


def _gsm8k(console: Any, found: Preflight) -> None:
    g = found.gsm8k
    if g is None:
        _say(console, f"gsm8k sign-off: {f'off ({found.gsm8k_off})' if found.gsm8k_off else 'cannot run (below)'}")
        return
    aa = f", {g.aa} twice (A/A)" if g.aa else ""
    _say(
        console,
        f"gsm8k sign-off after the cells: {', '.join(g.tasks)}, {g.questions} questions per task and arm, "
        f"{g.servers} fresh servers (one per arm{aa}); its time is not in the prediction below",
    )


def _profile(console: Any, cfg: Config) -> None:
    """Which arms get a kernel profile (docs/concepts/profile.md), and what it costs."""
    on = [a.name for a in cfg.arms if cfg.profile.enabled and a.profile]
    off = [a.name for a in cfg.arms if a.name not in on]
    if not on:
        _say(console, "kernel profiles: off" + ("" if not cfg.profile.enabled else " (every arm has profile = false)"))
        return
    _say(
        console,
        f"kernel profiles: {', '.join(on)}"
        + (f" (not {', '.join(off)}: profile off)" if off else "")
        + f"; one untimed long and short round per cell at each server's end, through vLLM's profiler (not in "
        f"the prediction below); raw traces: {cfg.profile.trace}",
    )


def _prediction(console: Any, cfg: Config, cells: list[Cell]) -> None:
    if cfg.workload.route == "primed":
        cs = ", ".join(map(str, cfg.workload.concurrency))
        _say(
            console,
            f"batch: c in {cs} requests decode together (the primed route at every point: docs/concepts/load.md)",
        )
    from e2e.analysis.prior import plan_components, this_gpu
    from e2e.cli.plan_cost import plan_cost

    gpu = this_gpu(cfg)
    widest = _resolves(console, cfg, cells, gpu)
    cost = plan_cost(cfg, cells, plan_components(cfg, gpu=gpu)[0], widest)
    _say(
        console,
        f"predicted cost: {cost.gpu_minutes():.1f} GPU-min ({cost.servers} servers, {cost.server_s / 60:.1f} min "
        f"of server time x {cost.gpus_per_server} GPU each; from {cost.source}; the gsm8k step and "
        "bookend rounds not counted)",
    )
    if cost.target:
        _say(console, _target_line(cost.target, cost.gpu_minutes))


def _resolves(console: Any, cfg: Config, cells: list[Cell], gpu: str | None) -> float | None:
    """The table of what each comparison should resolve; the widest predicted interval (None: none)."""
    from rich.table import Table

    from e2e.analysis.prior import predict_plan

    if min((c.rounds or cfg.workload.rounds for c in cells), default=0) < 2:  # a median of 1 has no spread
        _say(console, "prediction: none (a cell of 1 round has no spread to predict an interval from)")
        return None
    pred = predict_plan(cfg, cells, gpu=gpu)
    if pred.get("note"):
        _say(console, f"prediction: {pred['note']}")
        return None
    t = Table(title=f"what this plan should resolve (from {pred['source']})")
    for col in ("arm / ref", "point", "95 % CI +-%", "MDE %", "df"):
        t.add_column(col)
    ref = cfg.arms[0].name
    for c in pred["comparisons"]:
        mde = "-" if c["mde_pct"] is None else f"{c['mde_pct']:.2f}"
        if c.get("mde_lo_pct") is not None and c.get("mde_hi_pct") is not None:
            mde += f" ({c['mde_lo_pct']:.2f} to {c['mde_hi_pct']:.2f})"
        t.add_row(f"{c['arm']} / {ref}", str(Point.of(c)), f"{c['ci_half_width_pct']:.2f}", mde, f"{c['df']:.1f}")
    console.print(t)
    if pred.get("mde_interval"):
        _say(console, f"MDE % (lo to hi): {pred['mde_interval']}")
    if pred.get("grid"):
        _say(console, pred["grid"])
    return max((float(c["ci_half_width_pct"]) for c in pred["comparisons"]), default=None)


def _target_line(t: dict[str, Any], gpu_min: Any) -> str:
    head = f"--target-ci {t['target_pct']:g} %: the {t['pilot_passes']} planned passes are the pilot"
    if t["widest_pct"] is not None:
        head += f" (widest predicted +-{t['widest_pct']:.2f} %)"
    if "extra_passes" not in t:
        return f"{head}; {t['outcome']}"
    rounds = ", ".join(f"{d}: {n}" for d, n in sorted(t["rounds"].items()))  # point -> rounds
    widest = "-" if t["predicted_pct"] is None else f"+-{t['predicted_pct']:.2f} %"
    return (
        f"{head}; adaptive replication is predicted to add {t['extra_passes']} pass(es) at rounds per point "
        f"{rounds}: +{gpu_min(t['extra_s']):.1f} GPU-min, widest {widest} ({t['outcome']})"
    )
