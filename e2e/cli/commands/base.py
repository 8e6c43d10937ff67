"""What a subcommand is (asv's Command): its flags and its run. A run() returns the exit status;
library code raises UserError for bad input (exit 2) and never calls sys.exit."""

from __future__ import annotations

import argparse


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
