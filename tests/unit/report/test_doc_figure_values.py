"""A docs figure reads its run's recorded config typed (e2e/report/doc_figure_values.py, RunFolder.config):
a manifest that records no token counts, or a config field of the wrong type, is a figure the check
names as not recomputable (a LookupError or UserError, e2e/report/doc_figures.py), never a crash."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from e2e.errors import UserError
from e2e.report import doc_figures
from e2e.report.doc_figure_values import RunFolder, stalled_ms
from tests.support import ROOT

SRC = ROOT / "results" / "h200-load-tp1"  # the run the stall figures quote


def _copy(tmp_path: Path, edit: Any) -> RunFolder:
    for f in ("summary.json", "manifest.json", "cells.jsonl", "requests.jsonl"):
        shutil.copy(SRC / f, tmp_path / f)
    man = json.loads((SRC / "manifest.json").read_text())
    edit(man)
    (tmp_path / "manifest.json").write_text(json.dumps(man))
    return RunFolder(tmp_path)


def test_the_stall_figure_reads_the_recorded_token_counts(tmp_path):
    got = stalled_ms(_copy(tmp_path, lambda m: None))
    assert got == stalled_ms(RunFolder(SRC)) and got[0] <= got[1]


def test_no_recorded_token_counts_is_a_figure_not_recomputed(tmp_path):
    r = _copy(tmp_path, lambda m: m["config"]["workload"].pop("long_tokens"))
    with pytest.raises(LookupError, match="records no workload.long_tokens"):
        stalled_ms(r)


def test_a_malformed_config_is_a_figure_not_recomputed(tmp_path):
    r = _copy(tmp_path, lambda m: m["config"]["workload"].update(short_tokens="64"))
    with pytest.raises(UserError, match=r"config\.workload\.short_tokens"):
        stalled_ms(r)
    (tmp_path / "results" / "h200-load-tp1").mkdir(parents=True)
    for f in tmp_path.glob("*.json*"):
        shutil.copy(f, tmp_path / "results" / "h200-load-tp1" / f.name)
    lines = doc_figures.check(ROOT, tmp_path / "results", figures=["load.stalled.ms"])
    assert any("fig:load.stalled.ms: cannot be recomputed" in line and "short_tokens" in line for line in lines)
