"""Every committed summary.json is what `run_e2e.py report` computes from its run folder now (floats
to 1e-3 relative: e2e/report/rerender.py, the rule for every committed file, which `report` itself
keeps a committed summary by), on a clean clone: nothing outside the run folder is read (the
git-ignored assets/ least of all), so the committed reports say what their rows say on every machine."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from e2e.analysis.run_analysis import RunAnalysis
from e2e.report import report_md
from e2e.report import summary as sm
from e2e.report.write import gsm8k_summaries
from tests.support import ROOT, results_index
from tests.support.committed import differs

# the folders git tracks (the demo's scratch run beside them is not a committed report)
COMMITTED = [p for p in results_index().committed_folders(ROOT) if (p / "summary.json").is_file()]
_opened: list[Path] | None = None  # files opened while a test below records them


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _opened is not None and event == "open" and isinstance(args[0], (str, Path)):
        _opened.append(Path(args[0]).resolve())


sys.addaudithook(_audit)  # cannot be removed: it records only while _opened is a list


def test_the_comparison_tolerates_float_noise_only():
    s = {"a": [1.0, {"v": "equivalent", "n": 2}], "p": 1e-16}
    assert differs(s, {"a": [1.0 + 5e-5, {"v": "equivalent", "n": 2}], "p": 1.00004e-16}) == []
    assert differs(s, {"a": [1.01, {"v": "equivalent", "n": 2}], "p": 1e-16}) == ["/a[0]: 1.0 against 1.01"]
    assert differs(s, {"a": [1.0, {"v": "slower", "n": 2}], "p": 1e-16}) == ["/a[1]/v: 'equivalent' against 'slower'"]
    assert differs(s, {"a": [1.0, {"v": "equivalent", "n": 3}], "p": 1e-16}) != []
    assert differs(s, {"a": [1.0], "p": 1e-16}) != []


def _code(p: Path) -> bool:
    """Code and its data (modules, compiled libraries, fonts): not the run's inputs."""
    return p.suffix in (".py", ".pyc", ".so", ".pth") or any(
        str(p).startswith(str(Path(x).resolve())) for x in (sys.prefix, sys.base_prefix, ROOT / "e2e")
    )


@pytest.mark.parametrize("run", COMMITTED, ids=[p.name for p in COMMITTED])
def test_a_committed_summary_re_renders_from_its_run_folder_alone(run, tmp_path, monkeypatch):
    global _opened
    monkeypatch.chdir(tmp_path)  # an empty working folder: no assets/ beside it
    _opened = []
    try:
        s = report_md.as_json(sm.build(RunAnalysis(run), gsm8k_summaries(run)))
        opened = list(_opened)
    finally:
        _opened = None
    outside = sorted({str(p) for p in opened if not p.is_relative_to(run.resolve()) and not _code(p)})
    assert outside == [], f"{run.name}: the report read outside its run folder"
    found = differs(json.loads((run / "summary.json").read_text()), s)
    assert found == [], f"{run.name}: summary.json is not what `run_e2e.py report` gives now: re-render it"
