"""The run folder: append-only rows, torn lines, lock, schema version, attempts."""

from __future__ import annotations

import pytest

from e2e.errors import UserError
from e2e.rundir.formats import cell_row
from e2e.rundir.store import CELLS, RunStore, counted_requests, read_jsonl


def row(cell_id: str, attempt: str = "0") -> dict:
    return cell_row(cell_id=cell_id, attempt=attempt, pass_=1, arm="a", depth=1, status="ok")


def test_append_and_read_back(tmp_path):
    with RunStore.create(tmp_path / "r") as s:
        s.append(CELLS, row("a"))
        s.append(CELLS, row("b"))
        assert [r["cell_id"] for r in s.cells()] == ["a", "b"]
        assert s.cells()[0]["schema_version"] == 1


def test_torn_last_line_is_tolerated_and_repaired_on_append(tmp_path):
    s = RunStore.create(tmp_path / "r")
    with s:
        s.append(CELLS, row("a"))
    with open(tmp_path / "r" / CELLS, "ab") as f:
        f.write(b'{"schema_version": 1, "cell_id": "b", "att')
    assert [r["cell_id"] for r in read_jsonl(tmp_path / "r" / CELLS)] == ["a"]
    with RunStore(tmp_path / "r") as s2:
        s2.append(CELLS, row("c"))
        assert [r["cell_id"] for r in s2.cells()] == ["a", "c"]


def test_damage_in_the_middle_is_an_error(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"a": 1}\nnot json\n{"a": 2}\n')
    with pytest.raises(UserError, match="line 2 is not JSON"):
        read_jsonl(p)


def test_second_writer_is_refused(tmp_path):
    with RunStore.create(tmp_path / "r"):
        with pytest.raises(UserError, match="in use by another run"):
            RunStore(tmp_path / "r").lock()


def test_create_refuses_non_empty_folder(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "x").write_text("keep me")
    with pytest.raises(UserError, match="not empty"):
        RunStore.create(tmp_path / "r")
    assert (tmp_path / "r" / "x").read_text() == "keep me"


def test_other_schema_version_is_refused(tmp_path):
    (tmp_path / CELLS).write_text('{"schema_version": 99, "cell_id": "a"}\n')
    with pytest.raises(UserError, match="schema_version 99"):
        RunStore(tmp_path).cells()


def test_only_the_recorded_attempt_counts():
    cells = [{"cell_id": "a", "attempt": "1-x"}]
    reqs = [{"cell_id": "a", "attempt": "0-y", "v": 1}, {"cell_id": "a", "attempt": "1-x", "v": 2}]
    assert [r["v"] for r in counted_requests(cells, reqs)] == [2]
