"""The subcommands: one class each (asv's Command, vLLM sweep's subcommand table), and the table
the CLI is built from (the shared flag groups: e2e/cli/flags.py). A command's run() returns the
exit status; library code raises UserError for bad input (exit 2) and never calls sys.exit.
"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any

from e2e.cli.flags import (
    add_arms_flag,
    add_executor_flags,
    add_run_folder_flags,
    check_writable_folder,
    count,
    csv_ints,
    executor_options,
    positive,
    positive_int,
)
from e2e.errors import UserError

DEFAULT_CONFIG = "configs/gemma3-27b-it-w4a16-tp2.toml"


def add_config_flag(p: argparse.ArgumentParser) -> None:
    # default None, resolved to DEFAULT_CONFIG where used: --resume must see whether it was given
    p.add_argument("--config", help=f"TOML config (default: {DEFAULT_CONFIG})")


# Run flags that would change a run's config or plan: a resumed run keeps its own, so they are
# refused rather than silently ignored. (--no-progress, --no-gsm8k, --limit, --gsm8k-aa apply.)
RESUME_REFUSES = {
    "config": "--config",
    "order": "--order",
    "passes": "--passes",
    "depths": "--depths",
    "arms": "--arms",
    "reps": "--reps",
    "concurrency": "--concurrency",
    "model": "--model",
    "tp": "--tp",
    "server_mode": "--server-mode",
    "target_ci": "--target-ci",
    "out": "--out",
    "run_id": "--run-id",
    "retries": "--retries",
    "fail_fast": "--fail-fast",
    "dry_run": "--dry-run",
    "json": "--json",
    "max_passes": "--max-passes",
    "max_minutes": "--max-minutes",
    "gpu_exclusive": "--gpu-exclusive",
    "no_profile": "--no-profile",
    "profile_trace": "--profile-trace",
}


# -- the commands ---------------------------------------------------------------------------------
class Command:
    name = ""
    help = ""
    add_help = True

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        pass

    def run(self, a: argparse.Namespace) -> int:
        raise NotImplementedError

    def run_argv(self, argv: list[str]) -> int:
        """A subcommand with its own command line takes its argv whole (entry.main passes it)."""
        raise NotImplementedError


class Run(Command):
    name, help = "run", "run the latency cells (the default)"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        add_config_flag(p)
        p.add_argument("--order", help="stock-first | widened-first | <arm>-first | both")
        p.add_argument("--passes", type=positive_int("--passes"), help="passes, alternating the arm order")
        p.add_argument("--depths", type=csv_ints, help="comma-separated context depths in tokens")
        add_arms_flag(p, "the first is the reference")
        p.add_argument("--reps", type=positive_int("--reps"), help="timed rounds per cell (workload.rounds)")
        p.add_argument(
            "--concurrency",
            type=csv_ints,
            metavar="C",
            help="requests decoding together in a round (workload.concurrency; 1 = one at a time; above 1 "
            "the primed route at every point: docs/concepts/load.md); several (1,4,16) make a grid",
        )
        add_run_folder_flags(p)
        p.add_argument(
            "--model",
            help="a local model folder (with its config.json; a hub name needs model.vocab_size in the config)",
        )
        p.add_argument("--tp", type=positive_int("--tp"), help="tensor parallel size")
        p.add_argument(
            "--server-mode",
            choices=("fresh", "per-arm-pass"),
            help="fresh server per cell (default) or one per arm and pass",
        )
        p.add_argument("--retries", type=count("--retries"), help="fresh-server retries of a failed cell")
        p.add_argument(
            "--target-ci",
            type=positive("--target-ci"),
            metavar="PCT",
            help="add passes (servers per arm, counterbalanced) until every arm ratio's 95 %% "
            "interval is within +-PCT %% (or --max-passes / --max-minutes)",
        )
        p.add_argument(
            "--max-passes", type=positive_int("--max-passes"), help="adaptive replication: at most this many passes"
        )
        p.add_argument(
            "--max-minutes", type=positive("--max-minutes"), help="adaptive replication: no new pass after this long"
        )
        p.add_argument(
            "--fail-fast", action="store_true", help="stop at the first failed cell, or the first inert arm's cell"
        )
        p.add_argument(
            "--allow-inert",
            action="store_true",
            help="an inert arm (its patched function never called, or never answering differently) "
            "does not make the run exit 3; its verdict still reads inert",
        )
        p.add_argument(
            "--gpu-exclusive",
            choices=("retry", "warn", "fail"),
            help="a process on a cell's GPU that is not its server: measure the cell again on a "
            "fresh server (retry, default), count it marked contaminated (warn), or stop (fail)",
        )
        p.add_argument(
            "--dry-run",
            action="store_true",
            help="check what the run would refuse (exit 2, a line each), print the plan, the arms and the "
            "prediction, and exit",
        )
        p.add_argument("--json", action="store_true", help="with --dry-run: the plan as JSON")
        p.add_argument(
            "--no-profile",
            action="store_true",
            help="no kernel profile (profile.enabled = false): servers start without vLLM's profiler "
            "(docs/concepts/profile.md)",
        )
        p.add_argument(
            "--profile-trace",
            choices=("none", "gz"),
            help="keep each profiled round's raw traces gzipped in the run folder (gz, within "
            "profile.trace_cap_mib) or only their summary (none, the default)",
        )
        p.add_argument("--resume", metavar="RUN_DIR", help="finish the missing cells of a run")
        p.add_argument("--no-progress", action="store_true", help="plain lines instead of a live bar")
        p.add_argument("--no-gsm8k", action="store_true", help="skip the gsm8k sign-off after the cells")
        p.add_argument("--limit", type=count("--limit"), help="gsm8k: only the first N questions (0 = all)")
        p.add_argument("--gsm8k-aa", metavar="ARM", help="gsm8k: also run ARM on a second fresh server (A/A)")
        add_executor_flags(p)

    @staticmethod
    def overrides(a: argparse.Namespace) -> dict[str, Any]:
        o: dict[str, Any] = {}
        for flag, key in (
            ("order", "run.order"),
            ("passes", "run.passes"),
            ("depths", "workload.depths"),
            ("reps", "workload.rounds"),
            ("concurrency", "workload.concurrency"),
            ("out", "run.out"),
            ("model", "model.path"),
            ("tp", "server.tensor_parallel_size"),
            ("server_mode", "server.mode"),
            ("retries", "run.retries"),
            ("target_ci", "run.target_ci_pct"),
            ("max_passes", "run.max_passes"),
            ("max_minutes", "run.max_minutes"),
            ("gpu_exclusive", "run.gpu_exclusive"),
            ("profile_trace", "profile.trace"),
        ):
            v = getattr(a, flag, None)
            if v is not None:
                o[key] = v
        if getattr(a, "fail_fast", False):
            o["run.fail_fast"] = True
        if getattr(a, "no_profile", False):
            o["profile.enabled"] = False
        return o

    def run(self, a: argparse.Namespace) -> int:
        from e2e.design.config import load_config
        from e2e.design.plan import make_plan
        from e2e.report.progress import make_console
        from e2e.run import session
        from e2e.rundir.store import run_folder

        opts = session.Options(
            progress=not a.no_progress,
            gsm8k=not a.no_gsm8k,
            gsm8k_limit=a.limit,
            gsm8k_aa=a.gsm8k_aa,
            executor=executor_options(a),
            allow_inert=a.allow_inert,
        )
        if a.resume:
            given = [
                flag
                for dest, flag in RESUME_REFUSES.items()
                if getattr(a, dest, None) is not None and getattr(a, dest) is not False
            ]
            if given:
                raise UserError(
                    f"--resume: {', '.join(given)} cannot change a run (it keeps the config and "
                    "plan it recorded); drop it, or start a new run"
                )
            return session.resume(Path(a.resume), make_console(stderr=True), opts)
        arms = [x.strip() for x in a.arms.split(",") if x.strip()] if a.arms else None
        cfg = load_config(a.config or DEFAULT_CONFIG, self.overrides(a), arms=arms)
        names = [x.name for x in cfg.arms]
        if a.gsm8k_aa and a.gsm8k_aa not in names:  # else refused only after the cells ran
            raise UserError(f"--gsm8k-aa: no arm named {a.gsm8k_aa!r} (have: {', '.join(names)})")
        cells = make_plan(cfg)
        folder = run_folder(cfg.run.out, a.run_id, cfg.name)  # a name that is a path is refused by the dry run too
        if a.dry_run:  # the run's own check (session.start makes it too), then what the plan is
            from e2e.cli.plan_view import print_plan
            from e2e.run import preflight

            found = preflight.check(cfg, opts.gsm8k, opts.gsm8k_limit, opts.gsm8k_aa, opts.executor.kind == "local")
            return print_plan(cfg, cells, a.json, found)
        return session.start(cfg, cells, folder, make_console(stderr=True), opts)


class Delegate(Command):
    """A subcommand whose flags and body live in its own module: add(parser) and main(args)."""

    def __init__(self, name: str, help: str, module: str, add: str = "add_args", main: str = "main"):
        self.name, self.help, self.module, self.add, self.main = name, help, module, add, main

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        getattr(importlib.import_module(self.module), self.add)(p)

    def run(self, a: argparse.Namespace) -> int:
        status: int = getattr(importlib.import_module(self.module), self.main)(a)
        return status


class Gsm8k(Command):
    name, help = "gsm8k", "paired gsm8k sign-off of the arms (lm-eval)"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--config", help=f"TOML config (default: the --run-dir's own when it has a manifest, else {DEFAULT_CONFIG})"
        )
        add_arms_flag(p, "the first is the baseline; default: all")
        p.add_argument("--limit", type=int, help="questions per task (default: the config's; 0 = all 1319)")
        p.add_argument("--aa", metavar="ARM", help="also run ARM on a second fresh server (A/A baseline)")
        p.add_argument("--tasks", help="comma-separated tasks (default: the config's gsm8k.tasks)")
        p.add_argument("--num-concurrent", type=int, help="concurrent lm-eval requests (gsm8k.num_concurrent)")
        p.add_argument("--max-gen-toks", type=int, help="generated tokens per question (gsm8k.max_gen_toks)")
        add_run_folder_flags(p)
        p.add_argument(
            "--run-dir", help="write into this run folder (an existing run's, with its own config, or a new one)"
        )
        p.add_argument(
            "--assets-dir",
            type=Path,
            default=Path("assets"),
            help="where assets/gsm8k/test.jsonl lives (default: %(default)s)",
        )

    def run(self, a: argparse.Namespace) -> int:
        from e2e.run import session

        overrides: dict[str, Any] = {}
        for flag, key in (
            ("num_concurrent", "gsm8k.num_concurrent"),
            ("max_gen_toks", "gsm8k.max_gen_toks"),
            ("out", "run.out"),
        ):
            if getattr(a, flag, None) is not None:
                overrides[key] = getattr(a, flag)
        if a.tasks:
            overrides["gsm8k.tasks"] = [t.strip() for t in a.tasks.split(",") if t.strip()]
        run_dir = Path(a.run_dir) if a.run_dir else None
        cfg = session.gsm8k_config(run_dir, a.config, DEFAULT_CONFIG, overrides)
        arms = [x.strip() for x in a.arms.split(",") if x.strip()] if a.arms else None
        return session.gsm8k(cfg, run_dir, a.run_id, arms, a.limit, a.aa, a.assets_dir)


class CompareCommand(Delegate):
    """compare: --json FILE is checked before the runs are read, so an unwritable FILE is one line."""

    def run(self, a: argparse.Namespace) -> int:
        if getattr(a, "json", None):
            target = Path(a.json)
            if target.is_dir():
                raise UserError(f"--json {target}: is a folder; give a file name")
            if not target.parent.is_dir():
                raise UserError(f"--json {target}: folder {target.parent} does not exist")
            check_writable_folder(target.parent, f"--json {target}")
        return super().run(a)


class Kernels(Command):
    """Its own command line (kernels_check.cli), passed through whole."""

    name, help = "kernels", "kernel-level routing and error check (GPU): python -m kernels_check --help"
    add_help = False

    def run_argv(self, argv: list[str]) -> int:
        from kernels_check.cli import main as kernels_main

        return kernels_main(argv)


COMMANDS: dict[str, Command] = {
    c.name: c
    for c in (
        Run(),
        Delegate("assets", "fetch and build models and data", "e2e.assets"),
        Gsm8k(),
        Delegate("twin", "build a random-weight shape twin of a model", "e2e.twin"),
        Kernels(),
        Delegate(
            "report", "summary.json/csv, report.md and figures for a run; --pr: a block for a PR", "e2e.report.command"
        ),
        CompareCommand(
            "compare",
            "RUN_A RUN_B: exit 0 no regression, 1 regression, 3 cannot decide",
            "e2e.report.compare",
            "add_compare_args",
            "compare_main",
        ),
        Delegate("env", "a pinned venv of a vLLM release, wheel or checkout; prints its python", "e2e.serve.envs"),
        Delegate(
            "grid",
            "RUN [RUN ...] --out DIR: one load grid (table per c, figure) from several runs' verdicts",
            "e2e.report.grid",
            "add_grid_args",
            "grid_main",
        ),
        Delegate(
            "history",
            "a folder of runs: decode trend per arm and depth, and its change points",
            "e2e.report.history",
            "add_history_args",
            "history_main",
        ),
    )
}


def build_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="run_e2e.py", description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command")
    for c in COMMANDS.values():
        c.add_arguments(sub.add_parser(c.name, help=c.help, add_help=c.add_help))
    return p
