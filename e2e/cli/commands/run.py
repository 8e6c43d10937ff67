"""`run` (the default subcommand): plan the cells of a config, then run them, or resume a run, or
with --dry-run check and print the plan (e2e/cli/plan_view.py)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from e2e.cli.commands.base import Command
from e2e.cli.flags import (
    DEFAULT_CONFIG,
    add_arms_flag,
    add_config_flag,
    add_executor_flags,
    add_run_folder_flags,
    count,
    csv_ints,
    executor_options,
    positive,
    positive_int,
)
from e2e.errors import UserError

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

# flag -> the config key it overrides (workload.*, run.*, server.*, ...)
OVERRIDES = (
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
)


# -- the flags, in the order --help lists them ------------------------------------------------------
def add_plan_flags(p: argparse.ArgumentParser) -> None:
    """What is measured: the config, the arms, their order and the workload."""
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


def add_server_flags(p: argparse.ArgumentParser) -> None:
    """Where results go and what each server runs, and how often a failed cell is tried again."""
    add_run_folder_flags(p)
    p.add_argument(
        "--model", help="a local model folder (with its config.json; a hub name needs model.vocab_size in the config)"
    )
    p.add_argument("--tp", type=positive_int("--tp"), help="tensor parallel size")
    p.add_argument(
        "--server-mode",
        choices=("fresh", "per-arm-pass"),
        help="fresh server per cell (default) or one per arm and pass",
    )
    p.add_argument("--retries", type=count("--retries"), help="fresh-server retries of a failed cell")


def add_replication_flags(p: argparse.ArgumentParser) -> None:
    """Adaptive replication (--target-ci) and when a run stops or refuses."""
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


def add_output_flags(p: argparse.ArgumentParser) -> None:
    """The dry run, the kernel profile, --resume, the console and the gsm8k sign-off."""
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


class Run(Command):
    name, help = "run", "run the latency cells (the default)"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        add_plan_flags(p)
        add_server_flags(p)
        add_replication_flags(p)
        add_output_flags(p)
        add_executor_flags(p)

    @staticmethod
    def overrides(a: argparse.Namespace) -> dict[str, Any]:
        o: dict[str, Any] = {}
        for flag, key in OVERRIDES:
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
