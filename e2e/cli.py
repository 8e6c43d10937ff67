"""Command line: `run` (the default), and the subcommands that read or build around a run.

    python run_e2e.py [run] [--config FILE] [--order ...] [--dry-run [--json]] [--resume DIR] ...
    python run_e2e.py assets ...      fetch and build models and data (pinned by sha256)

Library code raises UserError; only main() turns errors into exit statuses:
0 done, 1 done with failed cells, 2 bad input, 130 interrupted.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from e2e.errors import UserError

DEFAULT_CONFIG = "configs/gemma3-27b-it-w4a16-tp2.toml"


def _csv_ints(s: str) -> list[int]:
    try:
        return [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None


def add_run_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=DEFAULT_CONFIG, help="TOML config (default: %(default)s)")
    p.add_argument("--order", help="stock-first | widened-first | <arm>-first | both")
    p.add_argument("--passes", type=int, help="passes, alternating the arm order")
    p.add_argument("--depths", type=_csv_ints, help="comma-separated context depths in tokens")
    p.add_argument("--arms", help="comma-separated subset of the config's arms, in this order")
    p.add_argument("--reps", type=int, help="timed rounds per cell (workload.rounds)")
    p.add_argument("--out", help="results root (default from config: results)")
    p.add_argument("--run-id", help="name of the run folder (default: time stamp + config name)")
    p.add_argument("--model", help="model path or hub name")
    p.add_argument("--tp", type=int, help="tensor parallel size")
    p.add_argument("--server-mode", choices=("fresh", "per-arm-pass"),
                   help="fresh server per cell (default) or one per arm and pass")
    p.add_argument("--retries", type=int, help="fresh-server retries of a failed cell")
    p.add_argument("--target-ci", type=float, metavar="PCT",
                   help="measure each cell until its 95 %% CI half-width is below PCT %% of the "
                        "estimate (or workload.max_rounds)")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first failed cell")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--json", action="store_true", help="with --dry-run: the plan as JSON")
    p.add_argument("--resume", metavar="RUN_DIR", help="finish the missing cells of a run")
    p.add_argument("--no-progress", action="store_true", help="plain lines instead of a live bar")
    p.add_argument("--no-gsm8k", action="store_true", help="skip the gsm8k sign-off after the cells")
    p.add_argument("--limit", type=int, help="gsm8k: only the first N questions")
    p.add_argument("--gsm8k-aa", metavar="ARM", help="gsm8k: also run ARM on a second fresh server (A/A)")


def overrides_from_args(a: argparse.Namespace) -> dict[str, Any]:
    o: dict[str, Any] = {}
    for flag, key in (("order", "run.order"), ("passes", "run.passes"), ("depths", "workload.depths"),
                      ("reps", "workload.rounds"), ("out", "run.out"), ("model", "model.path"),
                      ("tp", "server.tensor_parallel_size"), ("server_mode", "server.mode"),
                      ("retries", "run.retries"), ("target_ci", "workload.target_ci_pct")):
        v = getattr(a, flag, None)
        if v is not None:
            o[key] = v
    if getattr(a, "fail_fast", False):
        o["run.fail_fast"] = True
    return o


def select_arms(data_arms: list[dict[str, Any]], names: str) -> list[dict[str, Any]]:
    by_name = {a.get("name"): a for a in data_arms}
    out = []
    for n in [x.strip() for x in names.split(",") if x.strip()]:
        if n not in by_name:
            raise UserError(f"--arms: no arm named {n!r} (have: {', '.join(map(str, by_name))})")
        out.append(by_name[n])
    return out


def load_run_config(a: argparse.Namespace):
    import tomllib

    from e2e.config import load_config, parse_config, _set_dotted

    overrides = overrides_from_args(a)
    if a.arms:
        path = Path(a.config)
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise UserError(f"{path}: {exc}") from None
        data["arms"] = select_arms(data.get("arms", []), a.arms)
        for k, v in overrides.items():
            _set_dotted(data, k, v)
        return parse_config(data, str(path))
    return load_config(a.config, overrides)


def cmd_run(a: argparse.Namespace) -> int:
    from e2e.plan import make_plan, plan_table_rows
    from e2e.progress import make_console

    if a.resume:
        return _resume(a)
    cfg = load_run_config(a)
    cells = make_plan(cfg)
    if a.dry_run:
        if a.json:
            print(json.dumps([c.to_dict() for c in cells], indent=1))
        else:
            from rich.table import Table
            t = Table(title=f"plan: {cfg.name} ({len(cells)} cells, server mode {cfg.server.mode})")
            for col in ("index", "pass", "arm", "depth", "cell_id"):
                t.add_column(col)
            for r in plan_table_rows(cells):
                t.add_row(*r)
            make_console().print(t)
        return 0

    from e2e.launch import build_manifest
    from e2e.runner import make_sampler
    from e2e.store import RunStore

    sampler = make_sampler(cfg)
    run_id = a.run_id or f"{time.strftime('%Y%m%d-%H%M%S')}-{cfg.name}"
    root = Path(cfg.run.out) / run_id
    store = RunStore.create(root)
    with store:
        store.write_manifest(build_manifest(cfg, run_id, cells))
        store.write_plan([c.to_dict() for c in cells])
        return _execute(cfg, store, cells, a, make_console(stderr=True), sampler)


def _resume(a: argparse.Namespace) -> int:
    from e2e.config import parse_config
    from e2e.plan import Cell
    from e2e.progress import make_console
    from e2e.formats import now
    from e2e.runner import make_sampler
    from e2e.store import RunStore

    store = RunStore.open_existing(Path(a.resume))
    with store:
        m = store.manifest()
        cfg = parse_config(m["config"], f"{a.resume}/manifest.json")
        cells = [Cell(index=c["index"], pass_=c["pass"], arm=c["arm"], depth=c["depth"],
                      server_key=c["server_key"]) for c in store.plan()]
        sampler = make_sampler(cfg)
        m.setdefault("resumes", []).append({"started": now(), "git": m.get("git")})
        store.write_manifest(m)
        return _execute(cfg, store, cells, a, make_console(stderr=True), sampler)


def _execute(cfg, store, cells, a: argparse.Namespace, console, sampler) -> int:
    from e2e.progress import Progress, cells_table
    from e2e.report import write_report
    from e2e.formats import now
    from e2e.interrupts import INTERRUPTS, sigterm_as_interrupt
    from e2e.runner import Runner
    from e2e.stats import target_ci_stop_rule

    console.print(f"run folder: {store.root}")
    runner = Runner(cfg, store, cells, Progress(console, enabled=not a.no_progress), sampler,
                    stop_rule_factory=target_ci_stop_rule)
    try:
        runner.run()
    except INTERRUPTS:
        store.update_manifest(status="interrupted", ended=now())
        console.print(f"interrupted: servers stopped; rows so far are in {store.root}; "
                      f"continue with --resume {store.root}")
        return 130
    rows = store.cells()
    failed = [r for r in rows if r["status"] != "ok"]
    console.print(cells_table(rows, title=f"{cfg.name}: decode ms per token"))
    verdict = None
    if cfg.gsm8k.enabled and not a.no_gsm8k:  # the accuracy sign-off, each arm on a fresh server
        from e2e.accuracy.command import run_gsm8k
        try:
            with sigterm_as_interrupt():
                g = run_gsm8k(cfg, store.root, [x.name for x in cfg.arms], a.limit, aa=a.gsm8k_aa,
                              console=console)
        except INTERRUPTS:
            store.update_manifest(status="interrupted", ended=now())
            console.print(f"interrupted during gsm8k; latency rows are complete in {store.root}")
            return 130
        verdict = g["verdict"]
        store.update_manifest(gsm8k_verdict=verdict)
        console.print(f"gsm8k sign-off: {verdict} ({store.root / 'gsm8k' / 'gsm8k.md'})")
    store.update_manifest(status="complete" if not failed else "complete-with-failures", ended=now())
    write_report(store.root)
    console.print(f"report: {store.root / 'report.md'}")
    return 1 if failed or verdict not in (None, "pass") else 0


def cmd_assets(a: argparse.Namespace) -> int:
    from e2e import assets
    return assets.main(a)


def _sub_report(sub) -> None:
    from e2e import report
    report.add_report_args(sub.add_parser("report", help="summary.json/csv, report.md and figures for a run"))


def _sub_compare(sub) -> None:
    from e2e import compare
    compare.add_compare_args(sub.add_parser(
        "compare", help="RUN_A RUN_B: same decision rule; exit 1 on a significant regression"))
    compare.add_history_args(sub.add_parser("history", help="a table and a plot over a folder of runs"))


def _handlers() -> dict[str, Any]:
    from e2e import compare, report, twin
    from e2e.accuracy import command as gsm8k
    return {"run": cmd_run, "assets": cmd_assets, "twin": twin.main, "gsm8k": gsm8k.main,
            "report": report.report_main, "compare": compare.compare_main,
            "history": compare.history_main}


SUBCOMMANDS = ("run", "assets", "gsm8k", "twin", "kernels", "report", "compare", "history")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="run_e2e.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command")
    add_run_args(sub.add_parser("run", help="run the latency cells (the default)"))
    from e2e import assets
    assets.add_args(sub.add_parser("assets", help="fetch and build models and data"))
    from e2e import twin
    from e2e.accuracy import command as gsm8k
    gsm8k.add_args(sub.add_parser("gsm8k", help="paired gsm8k sign-off of the arms (lm-eval)"))
    twin.add_args(sub.add_parser("twin", help="build a random-weight shape twin of a model"))
    sub.add_parser("kernels", help="kernel-level routing and error check (GPU): python -m kernels_check --help",
                   add_help=False)
    _sub_report(sub)
    _sub_compare(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in SUBCOMMANDS + ("-h", "--help"):
        argv = ["run", *argv]
    # Result files follow the user's umask, but are never world-writable.
    os.umask(os.umask(0) | 0o002)
    if argv[0] == "kernels":  # its own command line (kernels_check.cli), passed through whole
        from kernels_check.cli import main as kernels_main
        return kernels_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _handlers()[args.command](args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
