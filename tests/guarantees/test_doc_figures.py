"""Every figure the docs quote from a committed run is recomputed from that run's folder
(e2e/report/doc_figures.py, the ids in doc_figure_registry.py): a text that is not what its run gives
fails here, as a row changed in a committed run but not in the docs would."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from e2e.report import doc_figure_values as values
from e2e.report import doc_figures as df
from e2e.report.doc_figure_registry import figure
from tests.support import ROOT

RESULTS = ROOT / "results"


def _results_with(tmp_path: Path, run: str) -> Path:
    """results/ beside the committed one: every folder linked, `run` copied (so it can be edited)."""
    out = tmp_path / "results"
    out.mkdir()
    for p in RESULTS.iterdir():
        if p.is_dir() and p.name != run:
            (out / p.name).symlink_to(p)
    dst = out / run
    dst.mkdir()
    for name in ("summary.json", "manifest.json", "cells.jsonl", "requests.jsonl"):
        shutil.copy(RESULTS / run / name, dst / name)
    return out


def test_the_docs_quote_their_runs():
    assert df.check() == []


def test_the_five_pages_quote_through_the_registry():
    """The pages issue 43 names hold marked figures, each registered."""
    qs = df.quotes([ROOT / p for p in df.PAGES] + [ROOT / "docs/results/index.md", ROOT / "docs/concepts/load.md"])
    pages = {q.page.relative_to(ROOT).as_posix() for q in qs}
    assert {"README.md", "results/README.md", "docs/results/index.md", "docs/concepts/load.md"} <= pages
    assert all(figure(q.id) is not None for q in qs)


def test_a_row_changed_in_a_committed_run_fails_the_check(tmp_path):
    """A stalled round's e2e moved in requests.jsonl and a step in summary.json: the figures drawn from
    them are named, each with its page, what it reads and what its run now gives."""
    res = _results_with(tmp_path, "h200-load-tp1")
    rows = [json.loads(line) for line in (res / "h200-load-tp1" / "requests.jsonl").read_text().splitlines()]
    r = values.RunFolder(res / "h200-load-tp1")
    worst = max(values.stalled_rounds(r), key=lambda g: g[0])[0]
    for row in rows:  # the round that held its answers longest, held 100 ms longer
        gap = values.stall.unexplained_s(row)
        if gap is not None and abs(1e3 * gap - worst) < 1e-6:
            row["server_e2e_s"] += 0.1
    (res / "h200-load-tp1" / "requests.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    s = json.loads((res / "h200-load-tp1" / "summary.json").read_text())
    next(x for x in s["load"] if x["arm"] == "stock" and x["depth"] == 8192 and x["concurrency"] == 4)["step_ms"] = (
        12.34
    )
    (res / "h200-load-tp1" / "summary.json").write_text(json.dumps(s))

    problems = df.check(results=res)
    stale = sorted({p.split(": fig:")[1].split(" ")[0] for p in problems})
    assert stale == ["load.fa3.8k.c4", "load.stalled.max.s", "load.stalled.ms", "load.stalled.steps"]
    assert any("'48 to 391 ms'; its run folder gives '48 to 491 ms'" in p for p in problems)
    assert all(p.startswith(("docs/", "README.md", "results/README.md")) for p in problems)


def test_update_dates_a_correction_and_fills_a_new_figure(tmp_path):
    page = tmp_path / "docs" / "p.md"
    page.parent.mkdir()
    page.write_text(
        "FA3 read <!-- fig:load32k.fa3.c1 -->11.30<!-- /fig --> ms; "
        "ROCM_ATTN <!-- fig:load32k.rocm.c1.ms -->?<!-- /fig --> ms; "
        "<!-- fig:load32k.fa3.c4 -->14.07<!-- /fig -->\n"
    )
    assert df.update(tmp_path, RESULTS, today="2026-12-06") == [
        "docs/p.md: fig:load32k.fa3.c1 '11.30' -> '11.33'",
        "docs/p.md: fig:load32k.rocm.c1.ms '?' -> '208.5'",
    ]
    assert page.read_text() == (
        "FA3 read <!-- fig:load32k.fa3.c1 -->11.33<!-- /fig --> (corrected 2026-12-06: was 11.30) ms; "
        "ROCM_ATTN <!-- fig:load32k.rocm.c1.ms -->208.5<!-- /fig --> ms; "
        "<!-- fig:load32k.fa3.c4 -->14.07<!-- /fig -->\n"
    )
    assert df.check(tmp_path, RESULTS, figures=[]) == []


def test_an_unknown_or_unreadable_figure_is_named(tmp_path):
    page = tmp_path / "docs" / "p.md"
    page.parent.mkdir()
    page.write_text("<!-- fig:no.such -->1.0<!-- /fig -->\n\n<!-- fig:load32k.fa3.c1 -->11.33<!-- /fig -->\n")
    problems = df.check(tmp_path, tmp_path / "results", figures=["load32k.fa3.c1", "load32k.fa3.c4"])
    assert problems[0] == "docs/p.md:1: fig:no.such is not registered in e2e/report/doc_figure_registry.py"
    assert problems[1].startswith(
        "docs/p.md:3: fig:load32k.fa3.c1: cannot be recomputed from results/h200-load-32k-tp1"
    )
    assert problems[2] == "fig:load32k.fa3.c4 is registered and quoted nowhere"
