"""`grid RUN [RUN ...] --out DIR`: one load grid drawn from several runs' verdicts (what it pools and
what it never does: e2e/report/grid.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from e2e import exits
from e2e.cli.commands.base import Command
from e2e.report import grid
from e2e.report.progress import make_console
from e2e.safety.safe_io import output_folder


class Grid(Command):
    name, help = "grid", "RUN [RUN ...] --out DIR: one load grid (table per c, figure) from several runs' verdicts"

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("runs", nargs="+", type=Path, help="run folders, oldest first (a later run wins a shared point)")
        p.add_argument("--out", type=Path, required=True, help="folder for grid.md, grid.json and ratio_vs_depth.png")

    def run(self, a: argparse.Namespace) -> int:
        console = make_console(stderr=False)
        summaries, rows = grid.read_grid(a.runs)
        out = output_folder(a.out, "--out")
        grid.write_grid(console, out, summaries, rows)
        return exits.OK
