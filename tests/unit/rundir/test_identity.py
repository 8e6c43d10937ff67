"""Code identity (e2e/rundir/identity.py): a run's manifest identifies the code that ran by content, so a
copy of the checkout with no `.git`, or a stale one, is still identified; report and compare say
when a run's code cannot be identified (report.md in one line, compare as a warning)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from e2e.rundir import identity
from tests.support import ROOT
from tests.support.synthetic import make_run


def _copy_package(to: Path) -> Path:
    for f in identity.package_files(ROOT):
        (to / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, to / f)
    return to


def _git(cwd: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t",
    }
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True, env=env).stdout


# Run in the copy: build_manifest of a new run (the installation probes, which start each arm's
# interpreter, are replaced: they say nothing about the code).
MANIFEST_OF_A_NEW_RUN = """
import json
from e2e.run import run_manifest
from e2e.design.config import parse_config
run_manifest.mf.installation = lambda python: {}
run_manifest.mf.gpu_driver = lambda: {}
cfg = parse_config({"model": {"path": "m"}, "workload": {"depths": [16]}, "arms": [{"name": "a"}],
                    "stats": {"measure_bandwidth": False}})
m = run_manifest.build_manifest(cfg, "r", [])
print(json.dumps({**m["code"], "manifest_config_sha256": m["config_sha256"]}))
"""


def _manifest_code(checkout: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", MANIFEST_OF_A_NEW_RUN],
        cwd=checkout,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(checkout)},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_new_runs_manifest_identifies_its_code_without_git(tmp_path):
    copy = _copy_package(tmp_path / "copy")
    code = _manifest_code(copy)
    assert code["commit"] is None and code["commit_holds_package"] is None
    assert code["package_sha256"] == identity.package_hash(ROOT) and code["package_files"] > 50
    assert code["config_sha256"] == code["manifest_config_sha256"]  # one hash of a config, not two
    d = identity.describe({"code": code})
    assert d["identified"] and "identified by content" in d["line"] and "no `.git`" in d["line"]


def test_a_stale_git_is_noticed_and_the_content_still_identifies(tmp_path):
    """A `.git` of an older commit travelled with newer files (the H200 copies): the commit does not
    hold the package that ran, even where `git status` cannot tell (an index that says unchanged)."""
    copy = _copy_package(tmp_path / "copy")
    _git(copy, "init", "-q")
    _git(copy, "add", "-A")
    _git(copy, "commit", "-qm", "the older code")
    assert _manifest_code(copy)["commit_holds_package"] is True
    # Uncommitted changes outside the package (a results folder renamed, as before the 0.23.0 H200
    # resume): dirty, yet the commit holds exactly the code that ran, and the report says so.
    (copy / "notes.txt").write_text("not code\n")
    _git(copy, "add", "notes.txt")
    code = _manifest_code(copy)
    assert code["dirty"] is True and code["commit_holds_package"] is True
    line = identity.describe({"code": code})["line"]
    assert "uncommitted changes outside the package, holding exactly the package" in line
    assert "does not hold it" not in line
    _git(copy, "rm", "-q", "--cached", "notes.txt")
    newer = copy / "e2e" / "report" / "summary.py"
    newer.write_text(newer.read_text() + "\n# the newer code, copied over the older .git\n")
    code = _manifest_code(copy)
    assert code["dirty"] is True and code["commit_holds_package"] is False
    assert code["package_sha256"] == identity.package_hash(copy) != identity.package_hash(ROOT)
    d = identity.describe({"code": code})
    assert d["identified"] and "does not hold it" in d["line"]
    _git(copy, "update-index", "--assume-unchanged", "e2e/report/summary.py")
    code = _manifest_code(copy)
    assert code["dirty"] is False and code["commit_holds_package"] is False


def test_legacy_manifests_and_the_loud_report(tmp_path, capsys):
    assert not identity.describe({"git": {"commit": None, "dirty": False}})["identified"]
    assert not identity.describe({"git": {"commit": "14f630b43e0d2ef1", "dirty": True}})["identified"]
    clean = identity.describe({"git": {"commit": "b1ddaf55406b24c1", "dirty": False}})
    assert clean["identified"] and "no content hash" in clean["line"]
    resumed = identity.describe(
        {
            "code": {
                "package_sha256": "a" * 64,
                "package_files": 90,
                "commit": "c" * 40,
                "dirty": False,
                "commit_holds_package": True,
            },
            "resumes": [{"git": {"commit": None, "dirty": None}}],
        }
    )
    assert not resumed["identified"] and resumed["line"].startswith("run: commit")

    from e2e.cli import main
    from e2e.report import write as report

    a = make_run(tmp_path / "a", {"stock": 2.0})
    b = make_run(tmp_path / "b", {"stock": 2.0}, seed=3)
    m = json.loads((b / "manifest.json").read_text())
    m["git"] = {"commit": "14f630b43e0d2ef1ce76", "dirty": True}
    (b / "manifest.json").write_text(json.dumps(m))
    report.write_report(b)
    said = [x for x in (b / "report.md").read_text().splitlines() if "14f630b43e0d" in x]
    assert (
        said[0].startswith("Code: commit `14f630b43e0d` with uncommitted changes") and "cannot be identified" in said[0]
    )
    report.write_report(a)
    assert "Code: " not in (a / "report.md").read_text()
    main(["compare", str(a), str(b)])
    out = capsys.readouterr().out
    assert f"warning: CODE NOT IDENTIFIED in {b.name}" in out and f"IDENTIFIED in {a.name}" not in out
