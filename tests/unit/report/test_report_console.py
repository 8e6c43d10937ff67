"""`report RUN` answers on the console (the verdict table and the sign-off, as a run ends); `report
--pr RUN` prints only a Markdown block for a vLLM pull request; report.md says in one line, not a
banner, that a run's code cannot be identified."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from e2e.cli import main
from e2e.report import write
from e2e.report.pr_block import pr_markdown
from tests.support import ROOT
from tests.support.synthetic import make_run

RESULTS = ROOT / "results"


def test_report_prints_the_verdict_table_and_the_sign_off(capsys, tmp_path):
    run = shutil.copytree(RESULTS / "cpu-demo", tmp_path / "cpu-demo")
    assert main(["report", str(run)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for needle in (
        "verdicts (each arm against stock; Holm, min effect 2 %)",
        "widened / stock │ 256 │ 0.961 │ 0.808 to 1.143 │ 32.7 │ inert",
        "gsm8k sign-off: inconclusive (10 questions)",
        "cpu-demo: 8 of 8 cells ok (each in report.md)",
        "report.md",
    ):
        assert needle in out, needle
    assert str(run / "summary.json") not in out  # a line saying what was written, not six paths


def test_the_committed_pr_block_is_the_runs_own(tmp_path):
    """results/h200-precision-tp1/pr.md is `report --pr` of that run, as committed."""
    run = RESULTS / "h200-precision-tp1"
    s = json.loads((run / "summary.json").read_text())
    m = json.loads((run / "manifest.json").read_text())
    md = pr_markdown(s, m, Path("results/h200-precision-tp1"))
    assert md + "\n" == (run / "pr.md").read_text()
    for needle in (
        "| `widened` | gfx11/gfx12 gate lower bound 1 instead of 3 (vllm#54210); False on NVIDIA either way | "
        "`widened-gfx11-gate` |",
        "| widened / stock | 32768 | 1.000 | 0.996 to 1.005 | 1.1 | equivalent |",
        "Figure: `results/h200-precision-tp1/ratio_vs_depth.png` (not linked: a pull request shows no relative image",
        "| widened | `FlashAttentionImpl h128 q32/kv16 sw1024 bs16 bfloat16 kv:auto` | forward:FlashAttentionImpl | 52 |",
        "NVIDIA H200 (driver 580.159.04), tensor parallel 1; vllm 0.26.0, torch 2.11.0",
        "python run_e2e.py report --pr results/h200-precision-tp1",
    ):
        assert needle in md, needle
    # code that cannot be identified: said once, in one line, at the top
    assert md.splitlines()[2].startswith("Harness code: commit `7e4bb464fb9f` with uncommitted changes")
    assert "WARNING" not in md


def test_the_pr_block_of_an_identified_run_with_a_sign_off(capsys, tmp_path):
    run = shutil.copytree(RESULTS / "h200-neighbour-tp1", tmp_path / "n")
    assert main(["report", "--pr", str(run)]) == 0
    md = capsys.readouterr().out
    assert md.startswith("## Decode latency: `widened` against `stock`\n\n### What each arm changes")
    assert "harness code: commit `02a8a7d7a91c`, clean, holding exactly the package that ran" in md
    demo = shutil.copytree(RESULTS / "cpu-demo", tmp_path / "demo")
    assert main(["report", "--pr", str(demo)]) == 0
    md = capsys.readouterr().out
    assert "### gsm8k sign-off\n\n**inconclusive** on 10 questions, baseline `stock`" in md
    assert "| AB: stock/r1 vs widened/r1 | gsm8k_cot_offline / strict-match (primary) |" in md
    assert "CPUAttentionBackendImpl" in md and "/.venv/bin/python -m vllm.entrypoints" in md  # the argv as run


def test_code_not_identified_is_one_line_not_a_banner(tmp_path):
    run = make_run(tmp_path / "r", {"stock": 2.0, "widened": 2.0})
    m = json.loads((run / "manifest.json").read_text())
    m["git"] = {"commit": None, "dirty": None}
    (run / "manifest.json").write_text(json.dumps(m))
    write.write_report(run)
    md = (run / "report.md").read_text()
    said = [x for x in md.splitlines() if "cannot be identified" in x]
    assert said[0] == "Code: no commit and no content hash recorded: the code that ran cannot be identified."
    assert "WARNING: CODE" not in md


def test_the_pr_block_links_its_figure_under_a_base_url_and_says_so_without_one(capsys):
    """A relative image is broken in a pull request: with --figure-base the link is absolute to the
    committed file; without it, the block names the file and how to link it."""
    run = RESULTS / "h200-precision-tp1"
    s, m = (json.loads((run / f).read_text()) for f in ("summary.json", "manifest.json"))
    base = "https://raw.githubusercontent.com/o/r/abc123"
    md = pr_markdown(s, m, Path("results/h200-precision-tp1"), base + "/")
    assert f"![ratio_vs_depth.png]({base}/results/h200-precision-tp1/ratio_vs_depth.png)" in md
    assert "](ratio_vs_depth.png)" not in pr_markdown(s, m, Path("results/h200-precision-tp1"))
    # a folder outside the checkout has no path in the repository: named, not linked
    assert "![" not in pr_markdown(s, m, Path("/nowhere/run"), base)


def test_the_pr_block_defines_every_word_it_uses_and_prints_no_none():
    """h200-load-tp1: a resumed run whose harness died (31 of 32 cells) with points the stall check
    emptied; h200-load-32k-tp1: points the KV cache could not hold. Every verdict word in the table is
    in the block's legend; no "None"; the code identity (the same for the run and its resume) once."""
    for name in ("h200-load-tp1", "h200-load-32k-tp1", "h200-plugin-proof", "cpu-demo"):
        run = RESULTS / name
        s, m = (json.loads((run / f).read_text()) for f in ("summary.json", "manifest.json"))
        md = pr_markdown(s, m, Path("results") / name)
        legend = next(x for x in md.splitlines() if x.startswith("Decode ms per token"))
        used = {c["decision"] for c in s["comparisons"] if c["scope"] == "pooled"}
        assert used and all(f"**{w}**" in legend or w == "faster" for w in used), (name, used)
        assert "None" not in md, name
        assert md.count("identified by content") <= 1 and md.count("cannot be identified") <= 1, name
    s = json.loads((RESULTS / "h200-load-32k-tp1" / "summary.json").read_text())
    assert "not measured (KV cache)" in {c["decision"] for c in s["comparisons"]}
    load = pr_markdown(s, json.loads((RESULTS / "h200-load-tp1" / "manifest.json").read_text()), Path("r"))
    assert "**not measured (KV cache)**: the server's KV cache cannot hold" in load


def test_report_of_a_committed_folder_rewrites_nothing_and_is_quick(tmp_path, capsys):
    """`report --pr` on a committed folder: every file keeps its bytes (git status stays clean), in
    under 10 s (33 s were reported; measured 2.2 s warm, 4.3 s with no compiled modules, 2026-12-06)."""
    import time

    run = shutil.copytree(RESULTS / "h200-load-tp1", tmp_path / "h200-load-tp1")
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".lock"}
    t0 = time.monotonic()
    assert main(["report", "--pr", str(run)]) == 0
    assert time.monotonic() - t0 < 10
    assert {p: (run / p).read_bytes() for p in before} == before
    assert capsys.readouterr().out.startswith("## Decode latency")


def test_float_noise_under_the_re_render_tolerance_keeps_the_summary_on_disk(tmp_path):
    """A summary.json whose floats differ from the recomputation by less than the re-render tests'
    tolerance (a newer numpy's REML stop) is kept byte for byte, and the tables are drawn from it; a
    change beyond it is written."""
    run = shutil.copytree(RESULTS / "cpu-demo", tmp_path / "demo")
    s = json.loads((run / "summary.json").read_text())
    pooled = next(c for c in s["comparisons"] if c["scope"] == "pooled" and c.get("ratio"))
    true_ratio = pooled["ratio"]
    pooled["ratio"] = true_ratio * (1 + 1e-9)  # noise
    noisy = json.dumps(s, indent=2) + "\n"
    (run / "summary.json").write_text(noisy)
    write.write_report(run)
    assert (run / "summary.json").read_text() == noisy
    assert repr(true_ratio * (1 + 1e-9)) in (run / "comparisons.csv").read_text()
    pooled["ratio"] = true_ratio * 1.01  # beyond the tolerance: recomputed
    (run / "summary.json").write_text(json.dumps(s, indent=2) + "\n")
    write.write_report(run)
    again = json.loads((run / "summary.json").read_text())
    assert next(c for c in again["comparisons"] if c["scope"] == "pooled" and c.get("ratio"))["ratio"] == true_ratio
