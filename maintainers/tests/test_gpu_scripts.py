"""maintainers/gpu/reference_tp1.sh refuses a run folder that git tracks files under: each device call
copies the working tree again and deletes there the tracked paths missing here, so on 2026-12-03 a
run started in results/h200-vllm023-tp1 (the partial renamed away in this checkout, still tracked in
the one the session began with) lost its manifest, plan and rows to the next poll. No GPU needed:
the refusal comes before anything is installed."""

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True, capture_output=True
    )


def _checkout(tmp_path: Path) -> Path:
    repo = tmp_path / "checkout"
    (repo / "maintainers" / "gpu").mkdir(parents=True)
    shutil.copy(ROOT / "maintainers" / "gpu" / "reference_tp1.sh", repo / "maintainers" / "gpu")
    (repo / "results" / "r").mkdir(parents=True)
    (repo / "results" / "r" / "manifest.json").write_text("{}\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "a committed partial run in results/r")
    # renamed away here, as before the 0.23.0 run: deleted in the tree, still in the copy's index
    (repo / "results" / "r" / "manifest.json").unlink()
    return repo


def _stage(repo: Path, n: int, **env: str) -> subprocess.CompletedProcess:
    base = {"PATH": "/usr/bin:/bin", "CONFIG": "configs/r.toml", "BUNDLE": ".b", "LAST": "1", "OUT": ""}
    return subprocess.run(
        ["bash", "maintainers/gpu/reference_tp1.sh", "stage", str(n)],
        cwd=repo,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_last_stage_refuses_a_run_folder_git_tracks(tmp_path):
    repo = _checkout(tmp_path)
    r = _stage(repo, 1)
    assert r.returncode == 2
    assert "git tracks files under results/r (results/r/manifest.json...)" in r.stderr
    assert "set RUN_ID to another name" in r.stderr


def test_another_run_id_or_an_earlier_part_passes_the_check(tmp_path):
    repo = _checkout(tmp_path)
    # Past the check, each fails at the part's install (no bundle here), exit 1, not the refusal's 2.
    for r in (_stage(repo, 1, RUN_ID="r-fresh"), _stage(repo, 0)):
        assert r.returncode == 1 and "git tracks" not in r.stderr
        assert "gpu-install.sh" in r.stderr
