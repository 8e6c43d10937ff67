"""Work on a fresh vLLM server, retried on a new one when the server fails.

Both users of a server (a run's cells, gsm8k's units) follow the same rule: a server that fails to
start or dies mid-work voids the attempt; the work is retried on a brand-new server up to `retries`
times; only then is it recorded as failed, with every attempt's reason. Errors that are not the
server's (a task error, bad output) are not retried: a fresh server would not change them.
"""
from __future__ import annotations

from typing import Callable, TypeVar

from e2e.server import ServerFailure, ServerGone, VllmServer

T = TypeVar("T")


class GaveUp(Exception):
    """Every attempt's server failed. Carries what the failure row needs."""

    def __init__(self, failures: list[str], last: Exception, log_tail: str, leftover_pids: list[int]):
        super().__init__("; ".join(failures))
        self.failures = failures
        self.last = last
        self.log_tail = log_tail
        self.leftover_pids = leftover_pids


def on_fresh_servers(new_server: Callable[[int], VllmServer], work: Callable[[VllmServer, int], T],
                     retries: int, on_retry: Callable[[int, Exception], None]
                     ) -> tuple[T, VllmServer, list[int]]:
    """Run work(server, attempt) inside a fresh server; returns (its result, the stopped server,
    the pids left after its teardown, which should be []). Raises GaveUp after retries + 1 failed
    servers."""
    failures: list[str] = []
    for attempt in range(retries + 1):
        server = new_server(attempt)
        try:
            with server:
                result = work(server, attempt)
            return result, server, server.stop()
        except (ServerFailure, ServerGone) as exc:
            left = server.stop()
            failures.append(f"attempt {attempt}: {exc}")
            if attempt < retries:
                on_retry(attempt, exc)
                continue
            raise GaveUp(failures, exc, getattr(exc, "log_tail", "") or server.log_tail(), left) from exc
    raise AssertionError("unreachable")  # the loop returns or raises
