"""The run-to-run prior's runs (e2e/analysis/run_prior.py, same_setup) are found by the anchor's setup
read from each run's recorded config, typed: a folder whose manifest cannot be read or is malformed
is none of them, and never stops the measurement; the anchor's own must read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from e2e.analysis import run_prior
from e2e.errors import UserError
from tests.support import ROOT

ANCHOR = json.loads((ROOT / "results" / run_prior.ANCHOR / "manifest.json").read_text())


def _plant(root: Path, name: str, manifest: dict[str, Any] | str) -> None:
    (root / name).mkdir()
    text = manifest if isinstance(manifest, str) else json.dumps(manifest)
    (root / name / "manifest.json").write_text(text)
    (root / name / "plan.json").write_text("[]")


def _edit(**server: Any) -> dict[str, Any]:
    man = json.loads(json.dumps(ANCHOR))
    man["config"]["server"].update(server)
    return man


def test_a_malformed_or_unreadable_folder_is_skipped_and_the_good_ones_are_found(tmp_path):
    _plant(tmp_path, "anchor", ANCHOR)
    _plant(tmp_path, "good", json.loads((ROOT / "results" / "h200-precision-tp1" / "manifest.json").read_text()))
    _plant(tmp_path, "bad-tp", _edit(tensor_parallel_size="two"))
    _plant(tmp_path, "bad-graphs", _edit(cuda_graphs="no"))
    _plant(tmp_path, "no-config", {k: v for k, v in ANCHOR.items() if k != "config"})
    _plant(tmp_path, "torn", json.dumps(ANCHOR)[:200])
    _plant(tmp_path, "eager", _edit(cuda_graphs=False))  # reads; another graph mode
    _plant(tmp_path, "tp2", _edit(tensor_parallel_size=2))  # reads; another tensor parallel
    assert run_prior.same_setup(tmp_path, "anchor") == [tmp_path / "anchor", tmp_path / "good"]


def test_the_anchor_itself_must_read(tmp_path):
    _plant(tmp_path, "anchor", _edit(tensor_parallel_size="two"))
    with pytest.raises(UserError, match=r"anchor/manifest.json: config\.server\.tensor_parallel_size"):
        run_prior.same_setup(tmp_path, "anchor")
