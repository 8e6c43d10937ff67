"""Command line: `run` (the default), and the subcommands that read or build around a run
(e2e/cli/commands/ holds one module per subcommand, and the table).

    python run_e2e.py [run] [--config FILE] [--order ...] [--dry-run [--json]] [--resume DIR] ...
    python run_e2e.py gsm8k | report | compare | history | kernels | twin | assets | env ...

Library code raises UserError; only e2e/exits.py turns errors into exit statuses: 0 done, 1 a
verdict (failed cells, a failed sign-off, a regression), 2 bad input or an error (a crash is 2 with
its traceback, never 1), 3 cannot decide, 130 interrupted.
"""

from __future__ import annotations

import os
import sys

from e2e.cli.commands import COMMANDS, build_parser
from e2e.exits import guarded


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in tuple(COMMANDS) + ("-h", "--help"):
        argv = ["run", *argv]
    # Result files follow the user's umask, but are never world-writable.
    os.umask(os.umask(0) | 0o002)
    if argv[0] == "kernels":  # its own command line, and its own guarded() (kernels_check.cli)
        return COMMANDS["kernels"].run_argv(argv[1:])
    return guarded(_dispatch, argv)


def _dispatch(argv: list[str]) -> int:
    args = build_parser(__doc__).parse_args(argv)
    return COMMANDS[args.command].run(args)
