"""Shared fixtures, and the markers each folder sets. Helpers that are not fixtures are in
tests/support/; the fixtures of real-server tests (the served model) in tests/server/conftest.py.

A test's folder is its tier (tests/README.md): everything under tests/server/ is marked `server`,
everything under tests/ray/ `ray` and `server`, here and nowhere else, so that
`-m "not server and not slow"` is the unit loop and starts no server. A test outside tests/server/
that launches a real vLLM server is refused as it launches (the audit hook below).

scripts/test.sh passes `-n auto` (pytest-xdist): a selection that leaves the server tier out runs on
one worker per core; any other runs here, one test at a time (the hooks under "several workers").
A test marked `alone` runs while no other test does."""

from __future__ import annotations

import fcntl
import itertools
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support import ROOT, have_vllm  # noqa: F401 (imported by tests)

TESTS = Path(__file__).resolve().parent
# The markers a tier's folder sets. Ray tests start a cluster (a GCS server, raylets, workers) and
# take minutes like a real server does, so they share `server` and leave the unit loop with it.
FOLDER_MARKS = {"server": ("server",), "ray": ("ray", "server")}

# A suite started in the background by a non-interactive shell (`bash .ci/run &`) inherits SIGINT
# ignored, and so would every harness it starts: the Ctrl-C tests would time out against a harness
# that never hears them. Python's own handler back, so the children start with the default again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def tier(path: Path) -> str:
    """The first folder under tests/ ("server", "ray", "unit", "guarantees"), "" for the root and
    for tests kept elsewhere (maintainers' tools keep theirs beside them)."""
    resolved = Path(path).resolve()
    if TESTS not in resolved.parents:
        return ""
    parts = resolved.relative_to(TESTS).parts
    return parts[0] if len(parts) > 1 else ""


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the folder's markers must be there to select on
def pytest_collection_modifyitems(config, items):
    for item in items:
        for name in FOLDER_MARKS.get(tier(item.path), ()):
            item.add_marker(name)


# -- no real vLLM server outside tests/server/ -------------------------------------------------------
_running: list[Path] = []  # the test whose setup, call or teardown is running now


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _running[:] = [item.path]
    try:
        with _turn(item):
            yield
    finally:
        _running.clear()


def _is_script(program: str) -> bool:
    """A stand-in `server.python` is a script (#!); a real interpreter is a binary."""
    found = shutil.which(program) or program
    try:
        with open(found, "rb") as f:
            return f.read(2) == b"#!"
    except OSError:
        return False


def real_vllm_server(argv: list[str]) -> bool:
    """argv starts vLLM's API server (either way e2e/serve/server.py builds it) in a real interpreter."""
    return len(argv) > 2 and argv[1] == "-m" and argv[2].startswith("vllm.entrypoints") and not _is_script(argv[0])


def _refuse_real_vllm_outside_server(event: str, args: tuple) -> None:
    if event != "subprocess.Popen" or not _running or tier(_running[0]) == "server":
        return
    argv = args[1]
    argv = [os.fsdecode(a) for a in argv] if isinstance(argv, (list, tuple)) else [os.fsdecode(argv)]
    if real_vllm_server(argv):
        raise RuntimeError(f"{_running[0]} starts a real vLLM server: tests that do live in tests/server/")


sys.addaudithook(_refuse_real_vllm_outside_server)


@pytest.fixture
def in_root(monkeypatch):
    monkeypatch.chdir(ROOT)
    return ROOT


# -- several workers (pytest-xdist) ------------------------------------------------------------------
def marker_names(config) -> list[str]:
    """The markers pyproject.toml registers (`name: what it means`)."""
    return [line.split(":")[0].strip() for line in config.getini("markers")]


def leaves_out_servers(markexpr: str, markers: list[str]) -> bool:
    """Whether `-m markexpr` deselects every test of the server tier, whatever other of `markers` it carries."""
    from _pytest.mark.expression import Expression  # pytest's own `-m` grammar

    if not markexpr:
        return False
    expr = Expression.compile(markexpr)
    others = [m for m in markers if m != "server"]
    subsets = (set(c) for n in range(len(others) + 1) for c in itertools.combinations(others, n))
    return not any(
        expr.evaluate(lambda name, marks=marks, **_: name in marks) for marks in ({"server"} | s for s in subsets)
    )


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_auto_num_workers(config):
    """`-n auto`: a worker per core (at most 8) for a selection without the server tier; none (this
    process, one test at a time) for one that may start a real server: each server takes the
    machine's cores, and two at once would time each other. PYTEST_XDIST_AUTO_NUM_WORKERS overrides."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    if not leaves_out_servers(config.option.markexpr, marker_names(config)):
        return 0
    return max(1, min(8, len(os.sched_getaffinity(0))))


_lock_files: dict[str, int] = {}


def _lock_file(name: str, run: str) -> int:
    """A lock file every worker of this session opens (xdist's testrunuid names the session)."""
    if name not in _lock_files:
        path = os.path.join(tempfile.gettempdir(), f"e2e-tests-{run}.{name}.lock")
        _lock_files[name] = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    return _lock_files[name]


@contextmanager
def _turn(item) -> Iterator[None]:
    """On an xdist worker, an `alone` test holds the session's lock exclusively (it waits for the
    tests running elsewhere, and no other starts until it ends); every other test holds it shared.
    A gate taken first keeps the waiting `alone` test from being passed over forever. Why `alone`:
    the orphan sweep that starts every run stops any orphan of this user on the host, so a test
    that leaves one on purpose and looks for it next, or plants one, must not share the host."""
    run = getattr(item.config, "workerinput", {}).get("testrunuid")
    if run is None:  # not on a worker: tests run one at a time already
        yield
        return
    gate, lock = _lock_file("gate", run), _lock_file("tests", run)
    alone = item.get_closest_marker("alone") is not None
    fcntl.flock(gate, fcntl.LOCK_EX)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
    finally:
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
    try:
        yield
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        if alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
