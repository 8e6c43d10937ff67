"""The summary model (e2e/report/summary.py): report.md, the CSVs and the console are functions of
summary.json alone; a cells.jsonl field is shown by declaring one column; the verdict words are one
table; the figures carry what the text claims (no plot without data, honest interval labels)."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from e2e.report import figures, report_md, tables
from e2e.report import summary as sm
from e2e.report import write as report
from e2e.rundir.store import CELLS
from e2e.stats import outcomes, signoff, verdicts
from tests.support import ROOT
from tests.support.synthetic import make_run

COMMITTED = sorted(p.parent for p in (ROOT / "results").glob("*/report.md"))


def _from_summary_alone(run: Path, out: Path) -> Path:
    """Only summary.json, in an empty folder: nothing else there could be read."""
    out.mkdir()
    shutil.copy(run / "summary.json", out / "summary.json")
    return out / "summary.json"


@pytest.mark.parametrize("run", COMMITTED, ids=[p.name for p in COMMITTED])
def test_committed_report_md_is_a_function_of_its_summary_json(run, tmp_path):
    s = json.loads(_from_summary_alone(run, tmp_path / "alone").read_text())
    assert report_md.markdown_report(s) == (run / "report.md").read_text()
    assert sorted(figures.drawn(s)) == sorted(p.name for p in run.glob("*.png") if p.name in figures.FILES)


def test_a_fresh_report_renders_again_from_summary_json_alone(tmp_path):
    run = make_run(tmp_path / "r", {"stock": 2.0, "widened": 2.3, "third": 2.0})
    report.write_report(run)
    s = json.loads(_from_summary_alone(run, tmp_path / "alone").read_text())
    assert report_md.markdown_report(s) == (run / "report.md").read_text()
    for name, table, rows in (
        ("summary.csv", sm.CELLS, s["cells"]),
        ("comparisons.csv", sm.COMPARISONS, s["comparisons"]),
    ):
        again = tables.write_table_csv(tmp_path / "alone" / name, table, rows, sm.SCHEMA_VERSION)
        assert again.read_text() == (run / name).read_text(), name
    # every section of report.md has its record in summary.json
    for key in (
        "run",
        "cells",
        "comparisons",
        "executor",
        "routing",
        "routing_warnings",
        "startups",
        "roofline",
        "gsm8k",
        "gpu_state",
        "warnings",
    ):
        assert key in s, key
    assert s["run"]["code"]["identified"] is True and s["run"]["exit_status"] is None


def test_a_cells_jsonl_field_is_shown_by_one_column(tmp_path, monkeypatch):
    """What a new cells.jsonl field needs to appear in summary.json, report.md, summary.csv and the
    console: the row carries it (formats.py's CellRow, set by runner.py) and CELLS declares it."""
    run = make_run(tmp_path / "r", {"stock": 2.0, "widened": 2.0}, depths=(1024,), passes=2)
    rows = [json.loads(x) for x in (run / CELLS).read_text().splitlines()]
    for i, r in enumerate(rows):
        r["kv_blocks_free"] = 1000 + i
    (run / CELLS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    col = tables.col("kv_blocks_free", "KV blocks free", "{}", sm.BOTH, from_row=True)
    monkeypatch.setattr(sm, "CELLS", tables.Table("cells", sm.CELLS.cols + (col,)))
    report.write_report(run)
    s = json.loads((run / "summary.json").read_text())
    assert [c["kv_blocks_free"] for c in s["cells"]] == [1000 + i for i in range(len(rows))]
    md = (run / "report.md").read_text()
    assert "| KV blocks free |" in md and "| 1003 |" in md
    with open(run / "summary.csv") as f:
        assert [r["kv_blocks_free"] for r in csv.DictReader(f)] == [str(1000 + i) for i in range(len(rows))]
    buf = io.StringIO()
    Console(file=buf, width=300).print(tables.render_console(sm.CELLS, s["cells"]))
    assert "KV blocks free" in buf.getvalue() and "1003" in buf.getvalue()


def test_the_verdict_words_are_one_table():
    assert set(outcomes.LATENCY) == set(verdicts.VERDICTS)
    assert set(outcomes.SIGNOFF) == set(signoff.Verdict.__args__) | {outcomes.INCOMPLETE}
    assert outcomes.status_of([verdicts.SLOWER, verdicts.INSUFFICIENT_REPLICATION]) == 1
    assert outcomes.status_of([verdicts.EQUIVALENT, verdicts.INSUFFICIENT_REPLICATION]) == 3
    # a gate that cannot tell never passes: inconclusive is 3 unless allowed (--allow-inconclusive)
    assert outcomes.status_of([verdicts.FASTER, verdicts.INCONCLUSIVE, verdicts.EQUIVALENT]) == 3
    assert outcomes.status_of([verdicts.FASTER, verdicts.INCONCLUSIVE], inconclusive_ok=True) == 0
    assert [outcomes.run_status(False, w) for w in (None, "pass", "fail", "inconclusive", "incomplete")] == [
        0,
        0,
        1,
        3,
        3,
    ]
    assert outcomes.run_status(True, "pass") == 1
    rule = outcomes.rule_text()
    assert all(
        w in rule
        for w in ("**slower** / **faster**", "**equivalent**", "**inconclusive**", "**insufficient replication**")
    )


def test_no_plot_without_data_and_honest_interval_labels(tmp_path):
    one_arm = make_run(tmp_path / "one", {"stock": 2.0})
    report.write_report(one_arm)
    assert not (one_arm / figures.RATIO).exists() and (one_arm / figures.DECODE).exists()
    assert figures.RATIO not in (one_arm / "report.md").read_text()
    single = make_run(tmp_path / "single", {"stock": 2.0, "x": 2.4}, passes=1)
    s = report_md.as_json(sm.build(report.RunAnalysis(single)))
    assert "within-server intervals only" in figures.ratio_caption(
        s
    ) and "between servers" not in figures.ratio_caption(s)
    pooled = make_run(tmp_path / "pooled", {"stock": 2.0, "x": 2.4})
    s = report_md.as_json(sm.build(report.RunAnalysis(pooled)))
    assert figures.ratio_caption(s).startswith(
        "A panel per arm pair"
    ) and "between servers (the variance model)" in figures.ratio_caption(s)
    # fresh servers: no line joins two cells (each had its own server)
    assert "no lines" in figures.decode_caption(s)
    rows = [json.loads(x) for x in (pooled / CELLS).read_text().splitlines()]
    for r in rows:  # one server per arm and pass, as --server-mode per-arm-pass records it
        r["server_key"] = f"p{r['pass']}-{r['arm']}"
        r["attempt"] = "0-a"
    (pooled / CELLS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    reqs = [json.loads(x) for x in (pooled / "requests.jsonl").read_text().splitlines()]
    (pooled / "requests.jsonl").write_text("".join(json.dumps({**r, "attempt": "0-a"}) + "\n" for r in reqs))
    s = report_md.as_json(sm.build(report.RunAnalysis(pooled)))
    assert "lines join the depths one server served" in figures.decode_caption(s)
    assert len(figures._server_lines(s["cells"])) == 4  # 2 arms x 2 passes, each over both depths


def test_the_console_says_the_answer(tmp_path):
    from e2e.run import session

    run = make_run(tmp_path / "r", {"stock": 2.0, "widened": 2.4})
    (run / "gsm8k").mkdir()
    (run / "gsm8k" / "summary.json").write_bytes((ROOT / "results/cpu-demo/gsm8k/summary.json").read_bytes())
    report.write_report(run)
    buf = io.StringIO()
    session.say_the_answer(Console(file=buf, width=200), run, 3, session.written_summary(run))
    out = buf.getvalue()
    for needle in (
        "verdicts (each arm against stock",
        "widened / stock",
        "slower",
        "MDE %",
        "95 % CI",
        "gsm8k sign-off: inconclusive (10 questions)",
        "strict-match (primary)",
        "exit status 3: done, but it could not decide",
    ):
        assert needle in out, needle


def test_a_decode_at_or_below_zero_still_gets_its_report_and_figure(tmp_path):
    """A tiny decode under load can estimate at or below zero (CI saw a stand-in at 1 ms/token whose
    run then died writing the decode figure: min() of no positive values). The report and the figure
    are written; the axis is linear and shows the point."""
    run = make_run(tmp_path / "neg", {"stock": -0.3, "x": 0.2}, passes=1)
    report.write_report(run)
    assert (run / figures.DECODE).stat().st_size > 0 and (run / "report.md").exists()
    fig, (ax,) = tables.new_panels(3, 2)
    figures._y_range(ax, [-0.3, 0.2, None, float("nan")], "y")
    lo, hi = ax.get_ylim()
    assert ax.get_yscale() == "linear" and lo < -0.3 and hi > 0.2
    fig2, (empty,) = tables.new_panels(3, 2)
    figures._y_range(empty, [None], "y")  # nothing to scale to: no exception
    assert empty.get_ylabel() == "y"
