"""What a grid needs, as the dry run says it (e2e/analysis/prior.py: predict_plan's `grid` line and the
stated default's server x concurrency excess above batch 1; issue 43 item 7)."""

from __future__ import annotations

from pathlib import Path

from e2e.analysis import prior
from e2e.design import plan as pl
from e2e.design.config import load_config
from e2e.design.point import Point
from tests.support import ROOT


def _predict(name: str) -> dict:
    cfg = load_config(ROOT / "configs" / f"{name}.toml")
    return prior.predict_plan(cfg, pl.make_plan(cfg), Path("/nonexistent"), gpu="no such GPU")


def test_a_grid_plan_says_what_three_servers_per_arm_would_resolve():
    out = _predict("h200-load-8k-tp1")  # 8K x 4, 16, 32; 2 passes; the stated default
    assert out["grid"].startswith("grid: with fewer than 3 servers per arm") and "widest MDE" in out["grid"]
    two = max(c["mde_pct"] for c in out["comparisons"])
    three = float(out["grid"].split("widest MDE ")[1].split(" %")[0])
    assert three < two  # a third server per arm gives every point its own excess, and more df


def test_the_default_prior_has_a_batch_term_above_batch_1_only():
    pts = [Point(1024), Point(1024, 16)]
    comp = prior.default_components(["a", "b"], pts)
    assert comp.tau2 == prior.SD_BATCH**2 and comp.weights == {Point(1024): 0.0, Point(1024, 16): 1.0}
    flat = prior.default_components(["a", "b"], [Point(1024)])
    assert flat.weights is None and flat.tau2 == prior.DEFAULT["sd_cell_excess"] ** 2  # batch 1 as before


def test_a_batch_1_plan_has_no_grid_line():
    assert "grid" not in _predict("h200-reference-tp1")
