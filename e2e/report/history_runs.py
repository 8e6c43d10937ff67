"""The runs of a history: the run folders under a folder (by name glob), read once each (a link or a
copy of a run already counted is skipped, named), in series order (vLLM version, or date). The
history itself is e2e/report/history.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from e2e.analysis.manifest_facts import vllm_version
from e2e.analysis.run_analysis import RunAnalysis
from e2e.errors import UserError


def version_key(v: str | None) -> tuple[Any, ...]:
    """Sort key for version strings: numeric release parts compare as numbers (0.9 < 0.26);
    unknown versions sort last. (No packaging dependency: the GPU machine has no index.)"""
    if not v:
        return (1, ())
    head = v.split(" / ")[0].split("+")[0]
    m = re.match(r"^v?(\d+(?:\.\d+)*)(.*)$", head)
    if not m:
        return (1, (head,))
    # a suffix (rc1, .dev3) sorts before the plain release of the same number
    return (0, tuple(int(x) for x in m.group(1).split(".")), m.group(2) == "", m.group(2))


def find_runs(folder: Path, match: str | list[str] = "*") -> list[Path]:
    """Run folders (manifest.json and plan.json) directly under folder whose name matches one of
    the globs."""
    if not folder.is_dir():
        raise UserError(f"history: {folder} is not a folder")
    globs = [match] if isinstance(match, str) else match
    runs = sorted(
        {p for g in globs for p in folder.glob(g) if (p / "manifest.json").is_file() and (p / "plan.json").is_file()}
    )
    if not runs:
        raise UserError(
            f"history: no run folders (with manifest.json) named {' or '.join(map(repr, globs))} under {folder}"
        )
    return runs


def identity(r: RunAnalysis) -> tuple[Any, ...]:
    """What makes a run itself wherever its folder lies: its id and start as its manifest says."""
    return (r.manifest.get("run_id"), r.manifest.get("started"), r.manifest.get("config_sha256"))


def read_runs(folder: Path, order_by: str, match: str | list[str] = "*") -> tuple[list[RunAnalysis], list[str]]:
    """The readable runs in series order, each once, and a warning for each run folder skipped (one
    that cannot be read, or that holds a run already counted: a link to it, or a copy). Of a run's
    folders the real one (not a link) is kept, then the first by name."""
    runs: list[RunAnalysis] = []
    skipped: list[str] = []
    seen: dict[Any, str] = {}
    for p in sorted(find_runs(folder, match), key=lambda p: (p.is_symlink(), p.name)):
        where = p.resolve()
        if where in seen:
            skipped.append(f"skipped {p.name}: the same folder as {seen[where]} (a link to it)")
            continue
        try:
            r = RunAnalysis(p)
        except UserError as exc:
            skipped.append(f"skipped {p.name}: {exc}")
            continue
        same = seen.get(identity(r))
        if same is not None:
            skipped.append(f"skipped {p.name}: the same run as {same} (its manifest's run id and start)")
            continue
        seen[where] = seen[identity(r)] = p.name
        runs.append(r)
    if order_by == "version":
        runs.sort(key=lambda r: (version_key(vllm_version(r.manifest)), r.manifest.get("started") or ""))
    else:
        runs.sort(key=lambda r: r.manifest.get("started") or "")
    return runs, skipped
