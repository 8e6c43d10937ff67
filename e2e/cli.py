"""Command line: `run` (the default), and the subcommands that read or build around a run
(e2e/commands.py holds one class per subcommand).

    python run_e2e.py [run] [--config FILE] [--order ...] [--dry-run [--json]] [--resume DIR] ...
    python run_e2e.py gsm8k | report | compare | history | kernels | twin | assets ...

Library code raises UserError; only main() turns errors into exit statuses:
0 done, 1 done with failed cells, 2 bad input, 130 interrupted.
"""
from __future__ import annotations

import os
import sys

from e2e.commands import COMMANDS, build_parser
from e2e.errors import UserError


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in tuple(COMMANDS) + ("-h", "--help"):
        argv = ["run", *argv]
    # Result files follow the user's umask, but are never world-writable.
    os.umask(os.umask(0) | 0o002)
    try:
        if argv[0] == "kernels":
            return COMMANDS["kernels"].run_argv(argv[1:])
        args = build_parser(__doc__).parse_args(argv)
        return COMMANDS[args.command].run(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
