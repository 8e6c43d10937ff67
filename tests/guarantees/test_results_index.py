"""Numbers that cannot go stale: results/README.md's tables are `scripts/results_index.py`'s, from the
committed summaries, and every number its prose quotes for a folder is that folder's summary's;
configs/cpu-releases.toml keeps the committed release runs' design."""

from __future__ import annotations

import json

from e2e.design.config import load_config
from e2e.design.plan import make_plan
from tests.support import ROOT, results_index


def _index():
    return results_index()


def test_the_results_readme_is_its_summaries():
    assert _index().check() == []


def test_a_stale_quote_or_an_edited_table_is_named(tmp_path):
    """The quotes results/README.md held before it was checked: each named with its folder."""
    idx = _index()
    old = (
        "| `h200-triton-tp1/` | the same twin. TRITON_ATTN / stock 0.977 (0.973 to 0.981) **faster** at 1K, "
        "1.110 (1.089 to 1.132) and 1.315 (1.273 to 1.358) **slower** at 8K and 32K (MDE 0.9 / 4.5 / 7.7 %). |\n"
        "| `cpu-demo/` | Widened/stock 1.102 (0.801 to 1.515) at 256 and 1.023 (0.785 to 1.333) at 1024: "
        "`inconclusive`, MDE 81 % / 64 % (two servers per arm). |\n"
        "| `h200-neighbour-tp1/` | Widened/stock 1.001, 1.004, 1.005 at 1K / 8K / 32K (MDE 1.2 %) |\n"
    )
    assert idx.stale_quotes(old) == [
        "h200-triton-tp1: 0.977 (0.973 to 0.981) is no verdict of its summary.json",
        "h200-triton-tp1: 1.110 (1.089 to 1.132) is no verdict of its summary.json",
        "h200-triton-tp1: 1.315 (1.273 to 1.358) is no verdict of its summary.json",
        "h200-triton-tp1: MDE 0.9 % is no verdict's MDE in its summary.json",
        "h200-triton-tp1: MDE 4.5 % is no verdict's MDE in its summary.json",
        "h200-triton-tp1: MDE 7.7 % is no verdict's MDE in its summary.json",
        "cpu-demo: 1.102 (0.801 to 1.515) is no verdict of its summary.json",
        "cpu-demo: 1.023 (0.785 to 1.333) is no verdict of its summary.json",
        "cpu-demo: MDE 81 % is no verdict's MDE in its summary.json",
        "cpu-demo: MDE 64 % is no verdict's MDE in its summary.json",
        "h200-neighbour-tp1: ratio 1.005 is no verdict of its summary.json",
    ]
    readme = (ROOT / "results" / "README.md").read_text()
    edited = readme.replace(
        "1.307 (1.298 to 1.315) **slower**, MDE 2.3 %", "1.315 (1.273 to 1.358) **slower**, MDE 7.7 %"
    )
    assert edited != readme and idx.generated(edited) == readme  # the table is rewritten from the summary


def test_every_committed_run_with_a_summary_is_in_the_index():
    readme = (ROOT / "results" / "README.md").read_text()
    block = readme.split("<!-- results-index: runs", 1)[1].split("<!-- /results-index: runs -->", 1)[0]
    runs = sorted(p.name for p in _index().committed_folders(ROOT) if (p / "summary.json").is_file())
    assert runs and [r for r in runs if f"| `{r}/` |" not in block] == []


def test_a_scratch_run_beside_the_committed_ones_is_not_indexed(tmp_path):
    """The README's demo leaves a git-ignored run folder in results/: the index (and its check) reads
    only the folders git tracks, so `demo.sh` then `test.sh` pass in that order."""
    import subprocess

    for name in ("kept", "scratch"):
        (tmp_path / "results" / name).mkdir(parents=True)
        (tmp_path / "results" / name / "summary.json").write_text("{}")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "results/kept/summary.json"], check=True)
    assert [p.name for p in _index().committed_folders(tmp_path)] == ["kept"]


def test_the_release_config_plans_the_committed_release_design():
    """The default went from 2 passes to 4; the release series compares like with like."""
    cells = make_plan(load_config(str(ROOT / "configs" / "cpu-releases.toml")))
    for run in sorted((ROOT / "results").glob("cpu-vllm-*")):
        plan = json.loads((run / "plan.json").read_text())
        assert [c.cell_id for c in cells] == [c["cell_id"] for c in plan], run.name


def test_a_dated_correction_may_quote_the_figure_it_replaced():
    """doc_figures' `update` keeps the old figure after the new one, dated: that quote is not stale,
    the same figure outside the correction is."""
    idx = _index()
    now = "| `h200-triton-tp1/` | TRITON_ATTN / stock at 1K: 0.977 (0.971 to 0.982) **faster** |\n"
    fixed = now.replace("**faster**", "(corrected 2026-12-06: was 0.977 (0.973 to 0.981)) **faster**")
    assert idx.stale_quotes(now) == []
    assert idx.stale_quotes(fixed) == []
    assert idx.stale_quotes(fixed.replace("(corrected 2026-12-06: was ", "(")) == [
        "h200-triton-tp1: 0.977 (0.973 to 0.981) is no verdict of its summary.json"
    ]
