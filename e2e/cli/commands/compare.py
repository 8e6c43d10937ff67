"""`compare RUN_A RUN_B`: is B slower than A? (the rule and its exit statuses: e2e/report/compare.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from e2e.cli.commands.base import Command
from e2e.cli.flags import add_run_sd_args, check_writable_folder
from e2e.errors import UserError
from e2e.report import compare
from e2e.report.progress import make_console
from e2e.rundir.store import write_json_atomic


def check_json_target(target: Path) -> None:
    """--json FILE is checked before the runs are read, so an unwritable FILE is one line."""
    if target.is_dir():
        raise UserError(f"--json {target}: is a folder; give a file name")
    if not target.parent.is_dir():
        raise UserError(f"--json {target}: folder {target.parent} does not exist")
    check_writable_folder(target.parent, f"--json {target}")


class Compare(Command):
    name, help = "compare", "RUN_A RUN_B: exit 0 no regression, 1 regression, 3 cannot decide"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("run_a", help="baseline run folder")
        p.add_argument("run_b", help="candidate run folder (a regression is B slower than A)")
        p.add_argument("--arm", action="append", help="arm(s) to compare (default: every arm in both runs)")
        p.add_argument("--force", action="store_true", help="compare although checked metadata differ")
        p.add_argument("--json", metavar="FILE", help="also write the comparison as JSON")
        add_run_sd_args(p)
        p.add_argument(
            "--allow-inconclusive",
            action="store_true",
            help="exit 0 when a row is inconclusive (it cannot tell; default: exit 3)",
        )

    def run(self, a: argparse.Namespace) -> int:
        """0 no regression, 1 regression, 3 cannot decide (2: bad input, from cli.main)."""
        if a.json:
            check_json_target(Path(a.json))
        console = make_console()
        c = compare.compare_pair(a.run_a, a.run_b, console, a.arm, a.force, a.allow_inconclusive, a.run_sd, a.run_prior)
        compare.say_comparison(console, c)
        if a.json:
            write_json_atomic(Path(a.json), c.to_json())
        compare.say_outcome(console, c)
        return c.status
