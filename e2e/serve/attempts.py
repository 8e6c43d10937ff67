"""Work on a fresh vLLM server, retried on a new one when the server fails.

Both users of a server (a run's cells, gsm8k's units) follow the same rule: a server that fails to
start or dies mid-work voids the attempt; the work is retried on a brand-new server up to `retries`
times; only then is it recorded as failed, with every attempt's reason. Errors that are not the
server's (a task error, bad output) are not retried: a fresh server would not change them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TypeVar

from e2e.serve.server import ServerFailure, ServerGone, VllmServer

T = TypeVar("T")


class GaveUp(Exception):
    """Every attempt's server failed. Carries what the failure row needs."""

    def __init__(self, failures: list[str], last: Exception, log_tail: str, leftover_pids: list[int]):
        super().__init__("; ".join(failures))
        self.failures = failures
        self.last = last
        self.log_tail = log_tail
        self.leftover_pids = leftover_pids


def on_fresh_servers(
    new_server: Callable[[int], VllmServer],
    work: Callable[[VllmServer, int], T],
    retries: int,
    on_retry: Callable[[int, Exception], None],
    unit: Callable[[], object] = lambda: None,
) -> tuple[T, VllmServer, list[int]]:
    """Run work(server, n) inside fresh servers (n counts the servers started here); returns (its
    result, the stopped server, the pids left after its teardown, which should be []).

    `unit` names the piece of work in hand: work that moves through several units on one server
    (a pass's depths on a per-arm-pass server) gives each unit its own `retries`, so a failure
    after unit A finished is B's first, not A's second. Raises GaveUp once one unit has failed on
    retries + 1 servers; its failures are that unit's, numbered from attempt 0."""
    failures: list[str] = []
    current = unit()
    for n in itertools.count():
        server = new_server(n)
        try:
            with server:
                result = work(server, n)
            return result, server, server.stop()
        except (ServerFailure, ServerGone) as exc:
            left = server.stop()
            if unit() != current:  # the work moved on before this failure: the new unit's first
                current, failures = unit(), []
            failures.append(f"attempt {len(failures)}: {exc}")
            if len(failures) <= retries:
                on_retry(len(failures) - 1, exc)
                continue
            raise GaveUp(failures, exc, getattr(exc, "log_tail", "") or server.log_tail(), left) from exc
        except BaseException:
            # An interrupt (or crash) between the block's teardown and the one above, or during
            # either before its signals were held: tear down again (stop is idempotent).
            server.stop()
            raise
    raise AssertionError("unreachable")  # the loop returns or raises
