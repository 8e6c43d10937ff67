"""The subcommands, one module each (asv's `commands/`): its flags and its run() in a Command
(base.py), and here the table the CLI is built from. Flag types and the flag groups several
subcommands share: e2e/cli/flags.py. A command's run() returns the exit status; library code raises
UserError for bad input (exit 2) and never calls sys.exit.
"""

from __future__ import annotations

import argparse

from e2e.cli.commands.assets import Assets
from e2e.cli.commands.base import Command
from e2e.cli.commands.compare import Compare
from e2e.cli.commands.env import Env
from e2e.cli.commands.grid import Grid
from e2e.cli.commands.gsm8k import Gsm8k
from e2e.cli.commands.history import History
from e2e.cli.commands.kernels import Kernels
from e2e.cli.commands.report import Report
from e2e.cli.commands.run import Run
from e2e.cli.commands.twin import Twin

# In the order `--help` lists them.
COMMANDS: dict[str, Command] = {
    c.name: c for c in (Run(), Assets(), Gsm8k(), Twin(), Kernels(), Report(), Compare(), Env(), Grid(), History())
}


def build_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="run_e2e.py", description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="command")
    for c in COMMANDS.values():
        c.add_arguments(sub.add_parser(c.name, help=c.help, add_help=c.add_help))
    return p
