"""The analysis computes from what a run folder holds (a RunRecord), never from the disk or from an
executor's name: rows in memory give the folder's summary, and the slot table follows the slots an
executor recorded, whatever it is called."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from e2e.analysis import run_folder
from e2e.analysis.run_analysis import RunAnalysis
from e2e.analysis.run_folder import RunRecord
from e2e.design.defaults import ALPHA
from e2e.errors import UserError
from e2e.report import report_md
from e2e.report import summary as sm
from tests.support.synthetic import make_run

NOWHERE = Path("/nonexistent/in-memory-run")


def _summary(run: RunRecord | Path) -> dict:
    return report_md.as_json(sm.build(RunAnalysis(run)))


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_rows_in_memory_give_the_folders_summary(tmp_path):
    run = make_run(tmp_path / "r", {"stock": 2.0, "widened": 2.2}, failed=("p1-d1024-stock",))
    record = RunRecord(
        root=NOWHERE,  # nothing is read from here: a path that does not exist
        manifest=json.loads((run / "manifest.json").read_text()),
        plan=json.loads((run / "plan.json").read_text()),
        cells=_jsonl(run / "cells.jsonl"),
        requests=_jsonl(run / "requests.jsonl"),
        status="complete",
    )
    from_rows, from_folder = _summary(record), _summary(run)
    # the synthetic model has no config.json anywhere: both say so, in their own words
    assert not from_rows.pop("roofline")["available"] and not from_folder.pop("roofline")["available"]
    assert from_rows == from_folder
    assert any("p1-d1024-stock: cell failed" in w for w in from_rows["warnings"])


def _with_executor(run: Path, entry: dict, slot_of=None) -> RunRecord:
    """The run as read, its manifest naming `entry` as the one executor; slot_of(i): cell row i's slot."""
    record = run_folder.read(run)
    cells = [
        {**c, **({"slot": slot_of(i)[0], "slot_host": slot_of(i)[1]} if slot_of else {})}
        for i, c in enumerate(record.cells)
    ]
    return dataclasses.replace(record, manifest={**record.manifest, "executors": [entry]}, cells=cells)


def test_an_executor_of_another_kind_that_records_slots_gets_the_slot_table(tmp_path):
    run = make_run(tmp_path / "r", {"stock": 2.0, "widened": 2.2})
    slots = [{"name": "s0", "host": "h0"}, {"name": "s1", "host": "h1"}]
    entry = {
        "kind": "batch-queue",
        "address": "queue.example:7000",
        "max_per_host": 1,
        "max_at_once": 2,
        "slots": slots,
    }
    s = _summary(_with_executor(run, entry, lambda i: (f"s{i % 2}", f"h{i % 2}")))
    assert s["executor"]["executors"] == ["batch-queue"] and s["executor"]["n_slots"] == 2
    assert sorted(s["slots"]["per_slot"]) == ["s0", "s1"]
    assert s["slots"]["per_slot"]["s1"]["host"] == "h1"
    md = report_md.markdown_report(s)
    assert "## Slots (where the cells ran: a blocking factor)" in md
    assert "batch-queue (address queue.example:7000): 2 slot(s) on 2 host(s)" in md


def test_an_executor_that_records_no_slots_gets_none_whatever_its_name(tmp_path):
    run = make_run(tmp_path / "r", {"stock": 2.0, "widened": 2.2})
    s = _summary(_with_executor(run, {"kind": "ray", "max_at_once": 1}))
    assert s["slots"] is None and s["executor"]["n_slots"] == 0
    md = report_md.markdown_report(s)
    assert "## Slots" not in md and "ray: one cell at a time on this host" in md


def test_the_recorded_config_is_read_once_typed_on_the_record(tmp_path):
    """RunRecord.config is the manifest's config, typed, and what the analysis decides with: a record
    whose manifest is replaced carries the new one's config, and a field of the wrong type is one line."""
    record = run_folder.read(make_run(tmp_path / "r", {"stock": 2.0, "widened": 2.2}))
    assert record.config.server.tensor_parallel_size == 2 and record.config.arms[1].name == "widened"
    cfg = record.manifest["config"]
    stricter = dataclasses.replace(
        record, manifest={**record.manifest, "config": {**cfg, "stats": {"min_effect_pct": 5.0}}}
    )
    assert (stricter.config.stats.min_effect_pct, stricter.config.stats.alpha) == (5.0, ALPHA)
    a = RunAnalysis(stricter)
    assert (a.min_effect_pct, a.alpha, a.tp, a.arms) == (5.0, ALPHA, 2, ["stock", "widened"])
    assert {c["min_effect_pct"] for c in a.comparisons} == {5.0}
    bad = {**record.manifest, "config": {**cfg, "stats": {"alpha": "0.05"}}}
    with pytest.raises(UserError, match=r"in-memory-run/manifest.json: config.stats.alpha: "):
        dataclasses.replace(record, root=NOWHERE, manifest=bad)
