"""`gsm8k`: the paired gsm8k sign-off of the arms (lm-eval), into a run's folder or a new one
(e2e/run/session.py owns the folder; e2e/accuracy/ runs the step)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from e2e.cli.commands.base import Command
from e2e.cli.flags import DEFAULT_CONFIG, add_arms_flag, add_run_folder_flags


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
