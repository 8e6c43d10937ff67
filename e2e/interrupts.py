"""Ctrl-C and SIGTERM, one way: both become an exception that unwinds through the same cleanup
(servers and lm-eval stopped, manifest marked interrupted, results kept, resumable)."""
from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Any, Iterator


class Terminate(BaseException):
    """SIGTERM, turned into an exception so the same cleanup as Ctrl-C runs."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminate()


INTERRUPTS = (KeyboardInterrupt, Terminate)


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside the block SIGTERM raises Terminate instead of killing the harness outright."""
    old = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
