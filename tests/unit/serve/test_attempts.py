"""The fresh-server retry rule (attempts.on_fresh_servers), with stand-in servers: the faults
(a server dying mid-work) are injected on demand, which a real server cannot do in seconds. The
real-server path is tests/server/test_faults.py."""

from __future__ import annotations

import pytest

from e2e.serve.attempts import GaveUp, on_fresh_servers
from e2e.serve.server import ServerGone


class FakeServer:
    """Only what on_fresh_servers touches: a context manager with stop() and log_tail()."""

    def __init__(self, n: int):
        self.n = n

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def stop(self) -> list[int]:
        return []

    def log_tail(self) -> str:
        return f"log of server {self.n}"


def shared_server_work(units: list[str], fail_at: dict[int, str]):
    """Work through `units` on one server; server n dies when it reaches unit fail_at[n]."""
    done: list[tuple[str, int]] = []

    def work(server: FakeServer, n: int) -> list[tuple[str, int]]:
        while len(done) < len(units):
            u = units[len(done)]
            if fail_at.get(n) == u:
                raise ServerGone(f"server {n} died in {u}")
            done.append((u, n))
        return done

    return work, done


def test_each_unit_on_a_shared_server_gets_its_own_retries():
    # Server 0 dies in A, server 1 finishes A and dies in B, server 2 finishes: with retries=1
    # that is A's one retry and B's one retry, not A's second failure.
    units = ["A", "B", "C"]
    work, done = shared_server_work(units, {0: "A", 1: "B"})
    retried: list[tuple[int, str]] = []
    result, server, left = on_fresh_servers(
        FakeServer,
        work,
        1,
        lambda a, e: retried.append((a, str(e))),
        unit=lambda: units[len(done)] if len(done) < len(units) else None,
    )
    assert result == [("A", 1), ("B", 2), ("C", 2)] and server.n == 2 and left == []
    assert retried == [(0, "server 0 died in A"), (0, "server 1 died in B")]


def test_a_unit_that_fails_on_every_server_gives_up_with_only_its_own_failures():
    units = ["A", "B"]
    work, done = shared_server_work(units, {0: "A", 1: "B", 2: "B"})
    with pytest.raises(GaveUp) as e:
        on_fresh_servers(
            FakeServer, work, 1, lambda a, e: None, unit=lambda: units[len(done)] if len(done) < len(units) else None
        )
    assert e.value.failures == ["attempt 0: server 1 died in B", "attempt 1: server 2 died in B"]
    assert e.value.log_tail == "log of server 2" and done == [("A", 1)]


def test_without_units_the_retries_are_the_work_s():
    # gsm8k's units: one piece of work, retries + 1 servers in all.
    started: list[int] = []

    def new(n: int) -> FakeServer:
        started.append(n)
        return FakeServer(n)

    def work(server: FakeServer, n: int) -> None:
        raise ServerGone(f"server {n} died")

    with pytest.raises(GaveUp) as e:
        on_fresh_servers(new, work, 2, lambda a, e: None)
    assert started == [0, 1, 2] and len(e.value.failures) == 3
