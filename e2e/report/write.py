"""A run folder's report files: summary.json (the summary model, e2e/report/summary.py), summary.csv,
comparisons.csv, report.md and the figures, all rendered from summary.json as written.

    python run_e2e.py report results/<run-id>

Every figure comes from e2e.analysis.run_analysis, which reads only the rows on disk; a report can be deleted and
recomputed at any time. A summary.json that the recomputation matches to float noise (e2e/report/rerender.py)
is kept, and every file is drawn from it: re-rendering a committed folder leaves `git status` clean. Every file written carries the summary's schema version (a key in JSON, a
column in CSV, a line in Markdown).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.analysis.run_analysis import RunAnalysis
from e2e.report import figures, report_md, rerender, tables
from e2e.report import summary as sm
from e2e.rundir.store import write_json_atomic
from e2e.safety.safe_io import check_closed, write_atomic

SCHEMA_VERSION = sm.SCHEMA_VERSION
FILES = ("summary.json", "summary.csv", "comparisons.csv", "report.md", *figures.FILES)


def gsm8k_summaries(run_dir: Path) -> list[dict[str, Any]]:
    """The sign-off's summary under <run>/gsm8k/ (its format is that step's), as {file, content}."""
    p = run_dir / "gsm8k" / "summary.json"
    if not p.is_file():
        return []
    try:
        content: Any = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        content = {"error": f"unreadable: {exc}"}
    return [{"file": str(p.relative_to(run_dir)), "content": content}]


@dataclass(frozen=True)
class Written:
    """What write() wrote (paths), from which summary (as summary.json holds it) of which run."""

    summary: dict[str, Any]
    manifest: dict[str, Any]
    paths: list[Path]


def _kept(path: Path, s: dict[str, Any]) -> dict[str, Any]:
    """The summary on disk where s says the same under the re-render tolerance (e2e/report/rerender.py):
    a newer numpy's float noise then rewrites no file of a committed folder (every file is drawn from
    the summary, so each keeps its bytes). Anything else, or an unreadable file: s."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return s
    return old if isinstance(old, dict) and not rerender.differs(old, s) else s


def write_report(run_dir: Path | str) -> list[Path]:
    """Analyse a run folder and write its report files into it; returns the paths written."""
    return write(run_dir).paths


def write(run_dir: Path | str) -> Written:
    """Analyse a run folder and write its report files into it."""
    root = Path(run_dir)
    check_closed(root)  # a link in the folder: refused before a row is read or a file written
    a = RunAnalysis(root)
    s = _kept(root / "summary.json", report_md.as_json(sm.build(a, gsm8k_summaries(root))))
    write_json_atomic(root / "summary.json", s)
    written = [root / "summary.json"]
    written.append(tables.write_table_csv(root / "summary.csv", sm.CELLS, s["cells"], SCHEMA_VERSION))
    written.append(tables.write_table_csv(root / "comparisons.csv", sm.COMPARISONS, s["comparisons"], SCHEMA_VERSION))
    drawn = figures.draw_run(s, root)
    for name in set(figures.FILES) - {p.name for p in drawn}:
        stale = root / name  # a figure an earlier report drew and this one has no data for
        if stale.is_file() and not stale.is_symlink():
            stale.unlink()
    written += drawn
    write_atomic(root / "report.md", report_md.markdown_report(s))
    written.append(root / "report.md")
    return Written(s, a.manifest, written)
