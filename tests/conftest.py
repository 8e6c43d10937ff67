"""Shared fixtures, and the markers each folder sets. Helpers that are not fixtures are in
tests/support/; the fixtures of real-server tests (the served model) in tests/server/conftest.py.

A test's folder is its tier (tests/README.md): everything under tests/server/ is marked `server`,
everything under tests/ray/ `ray` and `server`, here and nowhere else, so that
`-m "not server and not slow"` is the unit loop and starts no server. A test outside tests/server/
that launches a real vLLM server is refused as it launches (the audit hook below)."""

from __future__ import annotations

import os
import shutil
import signal
import sys
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
