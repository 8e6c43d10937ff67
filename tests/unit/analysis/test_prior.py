"""The dry run's prior (e2e/analysis/prior.py, find_prior) reads other runs' recorded config typed, as
every reader of a run folder does: a folder whose config has a field of the wrong type is no prior,
skipped as an unreadable one is, and planning goes on with the good one beside it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from e2e.analysis import prior
from e2e.design.config import config_from_manifest
from e2e.errors import UserError
from e2e.rundir.manifest_model import recorded_config
from tests.support import ROOT

SRC = ROOT / "results" / "h200-precision-tp1"  # a run with a variance model, of the H200 twin at TP 1


def _plant(folder: Path, manifest: dict[str, Any] | str) -> None:
    folder.mkdir()
    shutil.copy(SRC / "summary.json", folder / "summary.json")
    text = manifest if isinstance(manifest, str) else json.dumps(manifest)
    (folder / "manifest.json").write_text(text)


def _later(man: dict[str, Any]) -> dict[str, Any]:
    """The manifest started after the good one: it would be the newest prior, were it read."""
    return {**json.loads(json.dumps(man)), "started": "2099-01-01T00:00:00Z"}


def test_a_malformed_or_unreadable_folder_is_no_prior_and_the_good_one_is_used(tmp_path):
    man = json.loads((SRC / "manifest.json").read_text())
    _plant(tmp_path / "good", man)
    bad_tp = _later(man)
    bad_tp["config"]["server"]["tensor_parallel_size"] = "two"
    _plant(tmp_path / "bad-tp", bad_tp)
    bad_twin = _later(man)
    bad_twin["config"]["model"]["twin_of"] = 5
    _plant(tmp_path / "bad-twin", bad_twin)
    no_config = _later(man)
    del no_config["config"]
    _plant(tmp_path / "no-config", no_config)  # every field as assumed: another model (no path), not matched
    _plant(tmp_path / "torn", json.dumps(man)[:200])
    for name in ("bad-tp", "bad-twin"):  # malformed for the typed reader, not merely unmatched
        with pytest.raises(UserError, match="config"):
            recorded_config(json.loads((tmp_path / name / "manifest.json").read_text()), name)

    cfg = config_from_manifest(man, "planned")
    found, skipped = prior.find_prior(cfg, tmp_path, "NVIDIA H200")
    assert skipped is None and found is not None
    assert found[1].startswith(f"the variance model of {tmp_path / 'good'} (NVIDIA H200, ")
    _, line = prior.plan_components(cfg, tmp_path, gpu=None)  # any GPU's run: still the good one
    assert line.startswith(f"the variance model of {tmp_path / 'good'}, fitted on NVIDIA H200")


def test_the_prior_matches_a_twin_by_the_model_it_stands_for_and_the_tensor_parallel(tmp_path):
    man = json.loads((SRC / "manifest.json").read_text())
    moved = _later(man)
    moved["config"]["model"]["path"] = "/elsewhere/gemma-twin"  # another folder, the same twin_of
    _plant(tmp_path / "moved", moved)
    tp2 = _later(man)
    tp2["started"] = "2100-01-01T00:00:00Z"
    tp2["config"]["server"]["tensor_parallel_size"] = 2
    _plant(tmp_path / "tp2", tp2)
    found, _ = prior.find_prior(config_from_manifest(man, "planned"), tmp_path, "NVIDIA H200")
    assert found is not None and found[1].startswith(f"the variance model of {tmp_path / 'moved'} (")
    assert prior.model_identity(None, "/models/SmolLM2-135M") == "SmolLM2-135M"
    assert prior.model_identity(None, None) == ""
