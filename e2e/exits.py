"""How every entry point ends: the exit statuses, and the one place errors become them.

    0    done (and, where a verdict is drawn, nothing failed or regressed)
    1    a verdict: failed cells, a failed sign-off, a regression, failed kernel rows
    2    bad input (one line naming what is wrong) or an error (a crash prints its traceback and
         ends with `error: internal error: ...`; it is never 1, which means a verdict)
    3    done, but it cannot decide (an inconclusive or incomplete sign-off; compare or history
         without the replication to decide; a run with an inert arm, unless --allow-inert)
    130  interrupted (servers stopped, results kept; a run is resumable)

`run_e2e.py` (e2e/cli/entry.py) and `python -m kernels_check` (kernels_check/cli.py) both end through
guarded(); which result word gives which status is e2e/stats/outcomes.py's table.
"""

from __future__ import annotations

import errno
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from e2e.errors import UserError
from e2e.safety.interrupts import INTERRUPTS

OK, FAILED, BAD_INPUT, CANNOT_DECIDE, INTERRUPTED = 0, 1, 2, 3, 130

MEANING = {
    OK: "done",
    FAILED: "done, and a verdict failed (failed cells, a failed sign-off, a regression)",
    BAD_INPUT: "bad input or an error (the line above says which)",
    CANNOT_DECIDE: "done, but it could not decide (an inconclusive or incomplete sign-off, too few servers, "
    "or an inert arm: its patch changed nothing)",
    INTERRUPTED: "interrupted: servers stopped, results kept",
}

# The environment said no (permissions, read-only or full disk): one line, not a traceback.
_ENV_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT)


def worst(statuses: Any) -> int:
    """One status for several results: a failure (1) over cannot-decide (3) over done (0)."""
    s = set(statuses)
    return FAILED if FAILED in s else CANNOT_DECIDE if CANNOT_DECIDE in s else OK


def guarded(fn: Callable[..., int], *args: Any) -> int:
    """fn(*args)'s exit status, or the status its exception means (printed as one line on stderr;
    a crash with its traceback first)."""
    try:
        return fn(*args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except INTERRUPTS:
        print("interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:  # `| head` closed stdout: not a crash; stay quiet on the closed pipe
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print("error: output closed early (broken pipe)", file=sys.stderr)
        return BAD_INPUT
    except OSError as exc:
        if exc.errno not in _ENV_ERRNOS:
            return internal_error(exc)
        print(f"error: {exc.filename + ': ' if exc.filename else ''}{exc.strerror}", file=sys.stderr)
        return BAD_INPUT
    except Exception as exc:
        return internal_error(exc)


def internal_error(exc: BaseException) -> int:
    """A bug, not bad input: the traceback for a report, then one line last; exit 2."""
    traceback.print_exc(file=sys.stderr)
    first = (str(exc).splitlines() or [""])[0][:200]
    print(f"error: internal error: {type(exc).__name__}: {first} (traceback above; please report it)", file=sys.stderr)
    return BAD_INPUT
