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
    assert all(isinstance(r["concurrency"], int) for r in rows)  # 1 at batch 1, never null
    drawn = {(r["arm"], r["depth"], r["concurrency"]): r["run"] for r in rows if r["drawn"]}
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


def test_the_drawn_points_are_one_holm_family_across_the_runs(written):
    """The runs' unadjusted p's of the drawn points, Holm-adjusted together: the grid's MDE is taken at
    alpha / 12 (12 drawn points with a test), wider than each run's own at alpha / 6 or / 8, and every
    grid verdict is what the rule gives on the joint adjusted p's."""
    from e2e.stats import verdicts

    doc = json.loads((written / grid.GRID_JSON).read_text())
    assert "Holm step-down over the 12 drawn points" in doc["family"]
    rows = doc["rows"]
    drawn = [r for r in rows if r["drawn"]]
    assert all(r["grid_mde_pct"] >= r["mde_pct"] - 1e-9 for r in drawn)
    assert any(r["grid_mde_pct"] > r["mde_pct"] * 1.1 for r in drawn)  # the joint family costs power
    full = {
        (r["run"], r["arm"], r["depth"], r.get("concurrency") or 1): r
        for r in grid.pick([(n, grid._summary(ROOT / "results" / n)) for n in RUNS])
    }
    tested = [full[(r["run"], r["arm"], r["depth"], r["concurrency"])] for r in drawn]
    p_adj = verdicts.adjust([r["p_value"] for r in tested])
    e_adj = verdicts.adjust([r["p_equiv"] for r in tested])
    for r, pa, pe, shown in zip(tested, p_adj, e_adj, drawn):
        assert shown["grid_decision"] == verdicts.decide(r["ratio"], pa, pe, 0.05, 2.0)
    # a point no run could measure keeps its word in the grid column: the KV cache, not a refusal
    at_32k_16 = [r for r in rows if (r["depth"], r["concurrency"]) == (32768, 16)]
    assert at_32k_16 and all(r["grid_decision"] == "not measured (KV cache)" for r in at_32k_16)
    stalled = [r for r in rows if (r["run"], r["depth"], r["concurrency"]) == ("h200-load-tp1", 8192, 16)]
    assert stalled[0]["decision"] == "insufficient data" and stalled[0]["grid_decision"] is None  # superseded


def test_a_line_joining_runs_of_different_server_flags_is_marked(written):
    """The c = 1 line joins 8K (hybrid KV-cache manager on) to 32K (off): its marker shape changes,
    the segment between them is dotted, the legend names the flag and the caption says so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from e2e.report import figures

    summaries = [(r, grid._summary(ROOT / "results" / r)) for r in RUNS]
    fs = grid._figure_summary(summaries, grid.pick(summaries))
    flags = figures.settings(fs["comparisons"])
    assert sorted(m for m, _ in flags.values()) == ["o", "s"]
    assert [label for _, label in flags.values() if "--disable-hybrid" in label] == [
        "h200-load-32k-tp1: --disable-hybrid-kv-cache-manager"
    ]
    assert "a line joining two of them is dotted" in (written / grid.GRID_MD).read_text()
    seen = []
    orig = plt.Axes.plot

    def spy(self, *a, **k):
        seen.append((list(a[0]) if a and len(a[0]) else [], k.get("ls")))
        return orig(self, *a, **k)

    plt.Axes.plot = spy
    try:
        figures.ratio_grid(fs, written / "again.png")
    finally:
        plt.Axes.plot = orig
    dotted = [xs for xs, ls in seen if ls == ":"]
    solid = [xs for xs, ls in seen if ls == "-"]
    assert dotted and all(max(xs) > 16384 and min(xs) < 16384 for xs in dotted)  # 8K -> 32K only
    assert solid and all(max(xs) < 16384 for xs in solid)
    # one run's own grid has one flag set: plain lines, the caption unchanged
    one = {
        "run": fs["run"],
        "comparisons": [{k: v for k, v in r.items() if k != "server_flags"} for r in fs["comparisons"]],
    }
    assert len(figures.settings(one["comparisons"])) == 1 and "dotted" not in figures.grid_caption(one)


def test_an_arm_inert_in_its_run_stays_inert_in_the_joint_family():
    """Re-deciding the drawn rows on the joint Holm p's never turns a run's inert row (its patch
    changed nothing there) into equivalent; it still counts in the family, as in the run."""
    from e2e.stats import verdicts

    def row(arm: str, decision: str) -> dict:
        return {
            "arm": arm,
            "depth": 1024,
            "drawn": True,
            "decision": decision,
            "ratio": 1.0,
            "p_value": 1.0,
            "p_equiv": 1e-9,
            "min_effect_pct": 2.0,
            "mde_pct": 2.1,
            "se_log": 0.002,
            "df": 10.0,
        }

    rows = [row("widened", verdicts.INERT), row("other", verdicts.EQUIVALENT)]
    line = grid.joint_family(rows, 0.05)
    assert "2 drawn points" in line
    assert [r["grid_decision"] for r in rows] == [verdicts.INERT, verdicts.EQUIVALENT]
