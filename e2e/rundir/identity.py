"""What code ran, so that a run folder identifies it without trusting a `.git`.

    python -m e2e.rundir.identity [CHECKOUT]    # the package hash of a checkout, to match a manifest's

A run's manifest (`code`) records the git commit and whether the tree was dirty, and two content
hashes: of the package as run (every .py, .yaml and .toml file under e2e/ and kernels_check/, plus
run_e2e.py and pyproject.toml: sha256 over "path NUL sha256(file)" lines in path order) and of the
config as run (manifest_model.config_hash of the manifest's own `config`, the same value as the
manifest's `config_sha256`, so anyone can recompute it from the manifest). A copy of the checkout on another machine with a stale `.git`, or none, is
still identified by its package hash; `commit_holds_package` says whether the recorded commit holds
exactly those files (False: the `.git` that travelled with the copy is not the code that ran).
describe() is what `report` and `compare` say about it.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path
from typing import Any

from e2e.rundir import manifest as mf
from e2e.rundir.manifest_model import config_hash  # the manifest's config_sha256: one hash of a config

FOLDERS = ("e2e", "kernels_check")
TOP_FILES = ("run_e2e.py", "pyproject.toml")
SUFFIXES = (".py", ".yaml", ".toml")


def package_files(root: Path) -> list[str]:
    """The package's files, relative posix paths in order (caches and stray files left out)."""
    root = Path(root)
    out = [f for f in TOP_FILES if (root / f).is_file()]
    for folder in FOLDERS:
        out += [
            p.relative_to(root).as_posix()
            for p in (root / folder).rglob("*")
            if p.is_file() and p.suffix in SUFFIXES and "__pycache__" not in p.parts
        ]
    return sorted(out)


def package_hash(root: Path, files: list[str] | None = None) -> str:
    files = package_files(root) if files is None else files
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f}\0{hashlib.sha256((Path(root) / f).read_bytes()).hexdigest()}\n".encode())
    return h.hexdigest()


def _git_blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def commit_holds(root: Path, commit: str | None, files: list[str]) -> bool | None:
    """Whether `commit` holds exactly these files with these contents (None: no commit or no git)."""
    if not commit:
        return None
    try:
        r = subprocess.run(
            ["git", "-C", str(root), "ls-tree", "-r", commit, "--", *FOLDERS, *TOP_FILES],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    tree = {}
    for line in r.stdout.splitlines():
        meta, _, path = line.partition("\t")
        if path.endswith(SUFFIXES) and "__pycache__" not in path:
            tree[path] = meta.split()[2]
    here = {f: _git_blob((Path(root) / f).read_bytes()) for f in files}
    return tree == here


def identify(root: Path, config: dict[str, Any]) -> dict[str, Any]:
    """The manifest's `code` entry for the checkout at root running `config` (the manifest's)."""
    files = package_files(root)
    git = mf.git_commit(root)
    return {
        "package_sha256": package_hash(root, files),
        "package_files": len(files),
        "config_sha256": config_hash(config),
        "commit": git.get("commit"),
        "dirty": git.get("dirty"),
        "commit_holds_package": commit_holds(root, git.get("commit"), files),
    }


def describe(manifest: dict[str, Any]) -> dict[str, Any]:
    """{identified, line}: how the code of a run (and of each resume) is known, in words."""
    entries = [("run", manifest.get("code"), manifest.get("git"))]
    entries += [
        (f"resume {i}", r.get("code"), r.get("git"))
        for i, r in enumerate(manifest.get("resumes") or [], start=1)
        if isinstance(r, dict)
    ]
    said: dict[str, list[str]] = {}  # each line once, with every part of the run it holds for
    ok = True
    for who, code, git in entries:
        known, line = _one(code, git if isinstance(git, dict) else {})
        ok &= known
        said.setdefault(line, []).append(who)
    if len(said) == 1:  # the run and its resumes ran the same code: said once
        return {
            "identified": ok,
            "line": next(iter(said)) + (" (the run and every resume)" if len(entries) > 1 else ""),
        }
    return {"identified": ok, "line": "; ".join(f"{' and '.join(who)}: {line}" for line, who in said.items())}


def _one(code: dict[str, Any] | None, git: dict[str, Any]) -> tuple[bool, str]:
    if isinstance(code, dict) and code.get("package_sha256"):
        c, pkg = (
            code.get("commit"),
            f"package sha256 `{code['package_sha256'][:16]}` ({code.get('package_files')} files)",
        )
        if c and code.get("commit_holds_package"):
            # Dirty but holding the package: the uncommitted changes lie outside the code (a renamed
            # results folder, say); the commit still names exactly what ran.
            tree = "clean" if not code.get("dirty") else "uncommitted changes outside the package"
            return True, f"commit `{c[:12]}`, {tree}, holding exactly the package that ran; {pkg}"
        why = (
            "no `.git` with the copy that ran"
            if not c
            else f"commit `{c[:12]}` does not hold it (a stale `.git` or uncommitted changes)"
            if code.get("commit_holds_package") is False
            else f"commit `{c[:12]}` (not checked against it)"
        )
        return (
            True,
            f"{pkg}, identified by content: {why} (`python -m e2e.rundir.identity CHECKOUT` gives a checkout's)",
        )
    c = git.get("commit")
    if not c:
        return False, "no commit and no content hash recorded: the code that ran cannot be identified"
    if git.get("dirty"):
        return False, (
            f"commit `{c[:12]}` with uncommitted changes and no content hash: the code that ran "
            "cannot be identified (a stale `.git` that travelled with a copy reads the same)"
        )
    return True, (
        f"commit `{c[:12]}`, clean tree; no content hash recorded (the run predates it), so a stale "
        "`.git` would not have been noticed"
    )


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    root = Path(args[0]) if args else mf.project_root()
    files = package_files(root)
    print(f"{package_hash(root, files)}  {len(files)} files under {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
