"""Ctrl-C and SIGTERM, one way: both become an exception that unwinds through the same cleanup
(servers and lm-eval stopped, manifest marked interrupted, results kept, resumable), and neither
can cut a teardown short (held)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Terminate(KeyboardInterrupt):
    """SIGTERM, turned into an exception so the same cleanup as Ctrl-C runs. A KeyboardInterrupt,
    so that code which turns Ctrl-C into its own clean stop does the same for SIGTERM: Ray's
    ray.wait/ray.get raise KeyboardInterrupt for it, where any other exception from a signal
    handler became a SystemError."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminate()


INTERRUPTS = (KeyboardInterrupt, Terminate)
HELD = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside the block SIGTERM raises Terminate instead of killing the harness outright."""
    old = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


class held:
    """Inside the block SIGINT and SIGTERM interrupt nothing: they are noted (`.got`) and, unless an
    interrupt is already unwinding through the block, the first is delivered when it ends.

    Python runs a signal's handler in the main thread whichever thread the kernel gave the signal
    to, so swapping the handlers holds a signal for the whole process. (Blocking it with
    pthread_sigmask in the main thread did not: numpy's BLAS worker threads took it, and the
    handler then raised in the middle of the teardown.) Off the main thread a signal never
    raises, so there is nothing to hold."""

    def __init__(self, redeliver: bool = True):
        self.redeliver = redeliver
        self.got: list[int] = []
        self._old: dict[int, Any] = {}

    def __enter__(self) -> held:
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, lambda n, _f: self.got.append(n)) for s in HELD}
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)
        unwinding = exc_type is not None and issubclass(exc_type, INTERRUPTS)
        if self.got and self.redeliver and not unwinding:
            signal.raise_signal(self.got[0])  # its own handler now: KeyboardInterrupt, Terminate, ...
