"""Command line: `run` (the default), and the subcommands that read or build around a run
(e2e/commands.py holds one class per subcommand).

    python run_e2e.py [run] [--config FILE] [--order ...] [--dry-run [--json]] [--resume DIR] ...
    python run_e2e.py gsm8k | report | compare | history | kernels | twin | assets ...

Library code raises UserError; only main() turns errors into exit statuses:
0 done, 1 done with failed cells (run) or a regression (compare), 2 bad input or an error,
130 interrupted. A crash is 2 with the traceback on stderr, never 1 (which means a verdict).
"""
from __future__ import annotations

import errno
import os
import sys
import traceback

from e2e.commands import COMMANDS, build_parser
from e2e.errors import UserError
from e2e.interrupts import INTERRUPTS

# The environment said no (permissions, read-only or full disk): one line, not a traceback.
_ENV_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT)


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
    except INTERRUPTS:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `| head` closed stdout: not a crash; stay quiet on the closed pipe
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print("error: output closed early (broken pipe)", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno not in _ENV_ERRNOS:
            return _internal_error(exc)
        print(f"error: {exc.filename + ': ' if exc.filename else ''}{exc.strerror}", file=sys.stderr)
        return 2
    except Exception as exc:
        return _internal_error(exc)


def _internal_error(exc: BaseException) -> int:
    """A bug, not bad input: the traceback for a report, then one line last; exit 2."""
    traceback.print_exc(file=sys.stderr)
    first = (str(exc).splitlines() or [""])[0][:200]
    print(f"error: internal error: {type(exc).__name__}: {first} (traceback above; please report it)",
          file=sys.stderr)
    return 2
