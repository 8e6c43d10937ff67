"""`history DIR`: a folder of runs as series, their change points and whether the runs between them
held still (the rule and its exit statuses: e2e/report/history.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from e2e.cli.commands.base import Command
from e2e.cli.flags import add_run_sd_args
from e2e.report import history
from e2e.report.compare import run_sd_of
from e2e.report.progress import make_console
from e2e.safety.safe_io import output_folder


class History(Command):
    name, help = "history", "a folder of runs: decode trend per arm and depth, and its change points"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("folder", help="a folder of run folders (e.g. results/)")
        p.add_argument(
            "--order-by",
            choices=("version", "date"),
            default="version",
            help="order runs by vLLM version (then date) or by start date (default: %(default)s)",
        )
        p.add_argument(
            "--match",
            action="append",
            metavar="GLOB",
            help="only run folders whose name matches (e.g. 'cpu-vllm-*'; repeat for several; default: all)",
        )
        p.add_argument("--out", help="where history.csv/json/png go (default: the folder)")
        add_run_sd_args(p)
        p.add_argument(
            "--allow-inconclusive",
            action="store_true",
            help="exit 0 when a stretch of runs cannot be told from a change of the min effect (default: exit 3)",
        )

    def run(self, a: argparse.Namespace) -> int:
        console = make_console()
        folder = Path(a.folder)
        runs, skipped, short = history.read_history(folder, a.order_by, a.match or "*", console)
        run_sd = run_sd_of(runs[0], a.run_sd, a.run_prior)
        h = history.history(runs, run_sd)
        out = output_folder(Path(a.out), "--out") if a.out else folder
        history.say_history(console, h, f"history of {folder} (by {a.order_by}): {len(runs)} runs")
        history.say_assumed(console, run_sd, h)
        status = history.status_of(h.steps, h.answers, a.allow_inconclusive)
        history.write_history(console, out, h, a.order_by, skipped, run_sd, short, status)
        history.say_status(console, h, status)
        return status
