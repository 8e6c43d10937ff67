"""Kernel profiles in the report, the PR block, compare and history, from run folders written as the
runner writes them (tests/support/synthetic.py, plus profiles.jsonl rows as e2e/run/profiling.py
writes them): the per-arm step, the arm difference attributed to kernels up to the measured one, a
missing profile said in one line with the verdicts unchanged, and a folder from before profiles."""

from __future__ import annotations

import argparse
import json
import shutil

import pytest

from e2e.analysis.run_analysis import RunAnalysis
from e2e.cli.commands.compare import Compare
from e2e.profile import steps
from e2e.report import history, history_runs, report_md
from e2e.report import summary as sm
from e2e.report.pr_block import pr_markdown
from e2e.rundir.formats import profile_row
from e2e.rundir.store import PROFILES, RunStore
from tests.support.synthetic import make_run


def add_profiles(root, attn_us: dict[str, float], skip=(), missing=()):
    """A profile row per finished cell: 2 attention kernels and 4 GEMMs a step; the attention kernel's
    time per arm (and per depth, x1.5 at the deeper one)."""
    store = RunStore.open_existing(root)
    with store:
        depths = sorted({c["depth"] for c in store.cells()})
        for c in store.cells():
            if c["status"] != "ok" or c["cell_id"] in skip:
                continue
            ident = {k: c[k] for k in ("cell_id", "attempt", "pass", "arm", "depth")}
            if c["cell_id"] in missing:
                store.append(
                    PROFILES, profile_row(**ident, status="missing", reason="/start_profile: 404: no profiler")
                )
                continue
            attn = attn_us[c["arm"]] * 1.5 ** depths.index(c["depth"])
            ks = [
                {"name": "flash_fwd_kernel", "group": "attention", "calls_per_step": 2.0, "us_per_step": attn},
                {"name": "machete_gemm", "group": "gemm", "calls_per_step": 4.0, "us_per_step": 1500.0},
                {"name": "rms_norm_kernel", "group": "norm/elementwise", "calls_per_step": 2.0, "us_per_step": 50.0},
            ]
            store.append(
                PROFILES,
                profile_row(
                    **ident, status="ok", source="device kernels", steps=56, kernels=ks, **steps.step_groups(ks)
                ),
            )
    return root


def summary(run):
    return report_md.as_json(sm.build(RunAnalysis(run)))


def test_the_report_says_where_the_step_goes_and_what_differs(tmp_path):
    # 'slow' is 0.3 ms/token slower; its attention kernel carries 0.25 ms of it
    run = add_profiles(
        make_run(tmp_path / "r", {"stock": 2.0, "slow": 2.3}, between=0.002), {"stock": 300, "slow": 550}
    )
    s = summary(run)
    pt = s["profile"]["points"][0]
    assert [a["status"] for a in pt["arms"]] == ["ok", "ok"]
    stock = pt["arms"][0]
    assert stock["step_ms"] == pytest.approx(1.85)
    attn = next(g for g in stock["groups"] if g["group"] == "attention")
    assert attn["share"] == pytest.approx(0.3 / 1.85)
    (d,) = pt["differences"]
    assert d["top"][0]["name"] == "flash_fwd_kernel" and d["top"][0]["ms"] == pytest.approx(0.25)
    assert d["kernels_ms"] == pytest.approx(0.25)
    cmp = next(c for c in s["comparisons"] if c["scope"] == "pooled" and c["depth"] == pt["depth"])
    assert d["measured_ms"] == pytest.approx(cmp["diff_ms"])
    assert d["not_in_profile_ms"] == pytest.approx(cmp["diff_ms"] - 0.25)
    md = report_md.markdown_report(s)
    assert "## Where the decode step goes (kernel profile)" in md
    assert "What differs, slow - stock: measured" in md and "`flash_fwd_kernel`" in md and "not in the profile" in md
    pr = pr_markdown(s, RunStore.open_existing(run).manifest(), run)
    lines = [x for x in pr.splitlines() if x.startswith("- 1024:") or x.startswith("- 8192:")]
    assert len(lines) == 2 and "stock 16 %" in lines[0] and "slow" in lines[0]


def test_a_missing_profile_is_said_and_the_verdicts_stand(tmp_path):
    base = make_run(tmp_path / "base", {"stock": 2.0, "slow": 2.3}, between=0.002)
    shutil.copytree(base, tmp_path / "with")
    cells = RunStore.open_existing(base).cells()
    slow = [c["cell_id"] for c in cells if c["arm"] == "slow"]
    add_profiles(tmp_path / "with", {"stock": 300, "slow": 550}, missing=slow)
    a, b = summary(base), summary(tmp_path / "with")
    assert [c["decision"] for c in a["comparisons"]] == [c["decision"] for c in b["comparisons"]]
    arms = b["profile"]["points"][0]["arms"]
    assert arms[1]["status"] == "missing" and "404" in arms[1]["reason"]
    assert b["profile"]["points"][0]["differences"] == []
    assert "- **slow**: no profile (" in report_md.markdown_report(b)
    # the base folder took none: its harness had profiling on, so each arm says none was recorded
    assert a["profile"]["points"][0]["arms"][0]["reason"] == "no profile recorded"


def test_a_folder_from_before_profiles_keeps_its_summary(tmp_path):
    run = make_run(tmp_path / "old", {"stock": 2.0})
    m = json.loads((run / "manifest.json").read_text())
    del m["config"]["profile"]  # as a harness before profiles recorded its config
    (run / "manifest.json").write_text(json.dumps(m))
    s = summary(run)
    assert "profile" not in s  # the summary's keys are what they were
    assert "No kernel profile recorded in this run" in report_md.markdown_report(s)
    assert "Attention's share" not in pr_markdown(s, m, run)


def test_compare_and_history_name_the_kernels_that_moved(tmp_path, capsys):
    runs = tmp_path / "runs"
    for name, v, speed, attn, seed in (
        ("a1", "0.26.0", 2.0, 300, 1),
        ("a2", "0.26.0", 2.0, 300, 2),
        ("b1", "0.27.1", 2.5, 800, 3),
        ("b2", "0.27.1", 2.5, 800, 4),
    ):
        add_profiles(make_run(runs / name, {"stock": speed}, vllm=v, seed=seed, between=0.003), {"stock": attn})
    p = argparse.ArgumentParser()
    Compare().add_arguments(p)
    out = tmp_path / "c.json"
    Compare().run(p.parse_args([str(runs / "a1"), str(runs / "b1"), "--json", str(out)]))
    rows = json.loads(out.read_text())["rows"]
    assert rows[0]["kernels"]["top"][0] == {"name": "flash_fwd_kernel", "group": "attention", "ms": pytest.approx(0.5)}
    said = " ".join(capsys.readouterr().out.split())
    assert "kernels B - A +0.500 ms/step (flash_fwd_kernel +0.500" in said
    loaded, _ = history_runs.read_runs(runs, "version")
    h = history.history(loaded)
    assert h.steps and all(st["kernels"]["top"][0]["name"] == "flash_fwd_kernel" for st in h.steps)
