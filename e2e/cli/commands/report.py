"""`report RUN`: the report files again from the run's rows (e2e/report/write.py), then the answer on
the console as the run ended with it (e2e/report/answer.py); `report --pr RUN`: the same files, and on
stdout only the Markdown block for a vLLM pull request (e2e/report/pr_block.py). Exit 0 once written
(the run's own verdicts are in what it prints), 2 a folder that is not a run's or cannot be written."""

from __future__ import annotations

import argparse
from pathlib import Path

from e2e.cli.commands.base import Command
from e2e.errors import UserError
from e2e.report.answer import say_tables
from e2e.report.pr_block import pr_markdown
from e2e.report.progress import make_console, say
from e2e.report.write import write
from e2e.safety.safe_io import probe_writable


class Report(Command):
    name, help = "report", "summary.json/csv, report.md and figures for a run; --pr: a block for a PR"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("run_dir", help="a run folder (results/<run-id>)")
        p.add_argument(
            "--pr",
            action="store_true",
            help="print only a Markdown block for a vLLM pull request: arms, verdicts, figure, routing, "
            "sign-off, commands and versions",
        )
        p.add_argument(
            "--figure-base",
            metavar="URL",
            help="with --pr: the URL this checkout's files lie under once committed (e.g. "
            "https://raw.githubusercontent.com/OWNER/REPO/COMMIT), so the figure renders in the pull request; "
            "without it the block names the figure's path",
        )

    def run(self, a: argparse.Namespace) -> int:
        root = Path(a.run_dir)
        if root.is_dir():  # a missing folder gets the reader's own "not a run folder"
            try:
                probe_writable(root)
            except OSError as exc:
                raise UserError(f"report: {root} is not writable: {exc.strerror}") from None
        try:
            done = write(root)
        except OSError as exc:  # a single report file that cannot be replaced
            raise UserError(f"report: cannot write {exc.filename}: {exc.strerror}") from None
        if a.pr:
            print(pr_markdown(done.summary, done.manifest, root, a.figure_base))
            return 0
        console = make_console()
        say_tables(console, done.summary, cells=False)
        say(console, f"wrote {', '.join(p.name for p in done.paths)} in {root}")
        return 0
