"""An HTTP exchange bounded in time and size, whatever the server does: one deadline for all of it
(connect, send, headers, body), not per read, and at most `limit` bytes of body held.

A socket timeout bounds each read only: a server that trickles a byte a second keeps every read
short and the request alive for ever. So a watchdog shuts the connection's socket down when the
exchange's time is up; whatever read or write is blocked on it then returns at once, and the
exchange raises TimeoutError. One thread watches every exchange of the process, armed and disarmed
under a lock (no thread is started per request: a timed request must not pay for one).

A body over `limit` raises TooLarge before it is read whole (by its Content-Length, or once limit
bytes came): a server that answers 2 GB costs a failed request, never the harness's memory.
"""

from __future__ import annotations

import http.client
import itertools
import math
import select
import socket
import threading
import time
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

__all__ = ["ANSWER_MAX_BYTES", "TooLarge", "exchange", "get", "reopen_if_closed"]

ANSWER_MAX_BYTES = 16 << 20  # a completion's JSON: a few KB (no prompt echo, no logprobs asked)
_CHUNK = 1 << 20


class TooLarge(Exception):
    """An answer whose body is over the limit the caller set."""


class _Watchdog:
    """Calls a cut() once its deadline passes, unless disarmed first; one daemon thread for all."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._due: dict[int, tuple[float, Callable[[], None]]] = {}
        self._ids = itertools.count()
        self._wake_at = math.inf
        self._thread: threading.Thread | None = None

    def arm(self, deadline: float, cut: Callable[[], None]) -> int:
        with self._cv:
            token = next(self._ids)
            self._due[token] = (deadline, cut)
            if self._thread is None or not self._thread.is_alive():  # none yet, or a forked child's
                self._thread = threading.Thread(target=self._run, name="http deadlines", daemon=True)
                self._thread.start()
            if deadline < self._wake_at:  # deadlines come in order: this wakes the thread rarely
                self._cv.notify()
            return token

    def disarm(self, token: int) -> bool:
        """Whether it had fired already."""
        with self._cv:
            return self._due.pop(token, None) is None

    def _run(self) -> None:
        with self._cv:
            while True:
                now = time.monotonic()
                for token, (deadline, cut) in list(self._due.items()):
                    if deadline <= now:
                        del self._due[token]
                        cut()
                self._wake_at = min((d for d, _ in self._due.values()), default=math.inf)
                self._cv.wait(None if self._wake_at == math.inf else self._wake_at - now)


_WATCHDOG = _Watchdog()


def _cut(conn: http.client.HTTPConnection) -> Callable[[], None]:
    def cut() -> None:
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # unblocks a recv or send in another thread
            except OSError:
                pass

    return cut


def reopen_if_closed(conn: http.client.HTTPConnection) -> None:
    """An idle keep-alive connection that reads as ready was closed by the server (uvicorn closes
    after 5 s idle): close it here, so that the next request opens a new one instead of failing."""
    if conn.sock is not None and select.select([conn.sock], [], [], 0)[0]:
        conn.close()


def _read_body(r: http.client.HTTPResponse, limit: int) -> bytes:
    length = r.getheader("Content-Length")
    if length is not None and length.strip().isdigit():
        if int(length) > limit:
            raise TooLarge(f"answer of {int(length)} bytes, over the limit of {limit}")
        return r.read()
    body = bytearray()
    while chunk := r.read(min(_CHUNK, limit + 1 - len(body))):
        body += chunk
        if len(body) > limit:
            raise TooLarge(f"answer over the limit of {limit} bytes")
    return bytes(body)


def exchange(
    conn: http.client.HTTPConnection,
    method: str,
    path: str,
    body: bytes | None,
    headers: Mapping[str, str],
    timeout_s: float,
    limit: int,
) -> tuple[int, bytes]:
    """(status, body) of one request on conn, all of it within timeout_s. TimeoutError past it,
    TooLarge over limit (conn is closed after either: what is left unread must not be taken for
    the next answer); OSError or http.client.HTTPException as the connection fails."""
    token = _WATCHDOG.arm(time.monotonic() + timeout_s, _cut(conn))
    try:
        conn.request(method, path, body=body, headers=dict(headers))
        r = conn.getresponse()
        content = _read_body(r, limit)
    except TooLarge:
        _WATCHDOG.disarm(token)
        conn.close()
        raise
    except (OSError, http.client.HTTPException):
        fired = _WATCHDOG.disarm(token)
        conn.close()
        if fired:
            raise TimeoutError(f"no whole answer within {timeout_s:g} s") from None
        raise
    if _WATCHDOG.disarm(token):
        conn.close()  # cut just after the last byte: the answer is whole, the connection is not
    return r.status, content


def get(base_url: str, path: str, headers: Mapping[str, str], timeout_s: float, limit: int) -> tuple[int, bytes]:
    """exchange() of one GET on a connection of its own."""
    url = urlsplit(base_url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=timeout_s)
    try:
        return exchange(conn, "GET", url.path.rstrip("/") + path, None, headers, timeout_s, limit)
    finally:
        conn.close()
