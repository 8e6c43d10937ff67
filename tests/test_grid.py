"""`run_e2e.py grid`: one load grid from several runs (e2e/report/grid.py), on the committed H200 runs."""

from __future__ import annotations

import json

import pytest

from e2e.cli import main
from e2e.errors import UserError
from e2e.report import grid
from tests.support import ROOT
from tests.support.committed import differs

RUNS = ["h200-load-tp1", "h200-load-8k-tp1", "h200-load-32k-tp1"]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("grid")
    assert main(["grid", *(str(ROOT / "results" / r) for r in RUNS), "--out", str(out)]) == 0
    return out


def test_a_point_several_runs_measured_is_drawn_from_the_last_run_named(written):
    rows = json.loads((written / grid.GRID_JSON).read_text())["rows"]
    drawn = {(r["arm"], r["depth"], r["concurrency"] or 1): r["run"] for r in rows if r["drawn"]}
    # 8K x 4: both the first grid and the re-timing have a ratio; the re-timing (named later) is drawn
    assert drawn[("rocm-attn", 8192, 4)] == "h200-load-8k-tp1"
    assert drawn[("rocm-attn", 8192, 16)] == "h200-load-8k-tp1"  # the first grid has none there (stall)
    assert drawn[("rocm-attn", 1024, 32)] == "h200-load-tp1"
    assert drawn[("rocm-attn", 32768, 1)] == drawn[("widened", 32768, 4)] == "h200-load-32k-tp1"
    assert len(drawn) == 12 and all(r["ratio"] is not None for r in rows if r["drawn"])
    # every run's own row stays in the table, the one not drawn included
    assert {r["run"] for r in rows if (r["arm"], r["depth"], r["concurrency"]) == ("rocm-attn", 8192, 4)} == {
        "h200-load-tp1",
        "h200-load-8k-tp1",
    }


def test_the_grid_says_what_differs_between_its_runs(written):
    md = (written / grid.GRID_MD).read_text()
    assert "--disable-hybrid-kv-cache-manager" in md  # the 32K run's one server flag more
    assert "| `h200-load-8k-tp1` | 0.26.0 | NVIDIA H200 |" in md and "| 128 | 32 |" in md
    assert "Holm within that run's grid only" in md and (written / "ratio_vs_depth.png").stat().st_size > 10_000


def test_the_committed_grid_is_what_the_runs_say_now(written):
    assert (written / grid.GRID_MD).read_text() == (ROOT / "results" / "h200-load-grid" / grid.GRID_MD).read_text()
    # grid.json under the rule for every committed file: floats to its relative tolerance (the
    # re-render test's), all else exactly
    now = json.loads((written / grid.GRID_JSON).read_text())
    assert differs(json.loads((ROOT / "results" / "h200-load-grid" / grid.GRID_JSON).read_text()), now) == []


def test_runs_that_cannot_share_one_grid_are_refused_in_one_line(tmp_path, capsys):
    a = {"run": {"reference_arm": "stock", "min_effect_pct": 2.0}}
    b = {"run": {"reference_arm": "stock", "min_effect_pct": 1.0}}
    with pytest.raises(UserError, match=r"^b: its minimum effect is 1.0, a's 2.0: one grid needs one") as e:
        grid._check([("a", a), ("b", b)])
    assert "\n" not in str(e.value)
    assert main(["grid", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert main(["grid", str(ROOT / "results" / RUNS[0]), str(ROOT / "results" / RUNS[0]), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "not a run folder (no manifest.json)" in err and "a run is named twice" in err
    assert not (tmp_path / "out").exists()  # nothing written before the input was checked


def test_an_out_that_cannot_be_a_folder_is_one_line_for_grid_and_history(tmp_path, capsys):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    run = str(ROOT / "results" / RUNS[2])
    assert main(["grid", run, "--out", str(a_file)]) == 2
    assert main(["history", str(ROOT / "results"), "--match", RUNS[2], "--out", str(a_file / "sub")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert err == [f"error: --out {a_file}: cannot write there (File exists)"] + [
        f"error: --out {a_file / 'sub'}: cannot write there (Not a directory)"
    ]
