"""A voided attempt's request rows say so themselves (`voided`, `valid: false`): a reader filtering on
`valid` never counts them. Older folders, without the mark, keep the attempt match. The run loop's
voids on a real retry are asserted in tests/unit/gpu/test_gpu_state.py."""

from __future__ import annotations

from e2e.run.executors.node_side import NodeStore
from e2e.rundir.formats import request_row
from e2e.rundir.store import REQUESTS, RunStore, counted_requests


def _row(cell: str, attempt: str, k: int, **extra: object) -> dict:
    return request_row(
        cell_id=cell, attempt=attempt, pass_=1, arm="a", depth=16, n_tokens=8, round=k, valid=True, **extra
    )


def test_void_rows_marks_the_attempts_rows_and_keeps_every_other_line(tmp_path):
    store = RunStore.create(tmp_path / "r")
    with store:
        store.append(REQUESTS, _row("c1", "0-aa", 0))  # a cell the same server finished: counted
        store.append(REQUESTS, _row("c2", "0-aa", 0))
        store.append(REQUESTS, _row("c2", "0-aa", 1, invalid_reason="empty output") | {"valid": False})
        store.append(REQUESTS, _row("c2", "1-bb", 0))
        before = (store.root / REQUESTS).read_bytes().splitlines()
        store.void_rows("c2", "0-aa", "GPU not exclusive: pid 7 on the GPU at 'round 1'")
        store.void_rows("c2", "0-aa", "again")  # a row is marked once
        store.append(REQUESTS, _row("c2", "1-bb", 1))  # the run goes on appending to the new file
        rows = store.requests()  # read back through the row contract
    after = (store.root / REQUESTS).read_bytes().splitlines()
    assert after[0] == before[0] and after[3] == before[3] and len(after) == 5
    marked = [r for r in rows if r["cell_id"] == "c2" and r["attempt"] == "0-aa"]
    assert [r["valid"] for r in marked] == [False, False]
    assert all(r["voided"] == "GPU not exclusive: pid 7 on the GPU at 'round 1'" for r in marked)
    assert [r["invalid_reason"] for r in marked] == [
        "attempt voided: GPU not exclusive: pid 7 on the GPU at 'round 1'",
        "empty output",  # its own reason stays
    ]
    # a reader filtering on `valid` alone no longer counts the voided rounds
    assert {(r["cell_id"], r["attempt"]) for r in rows if r["valid"]} == {("c1", "0-aa"), ("c2", "1-bb")}


def test_counted_requests_leaves_out_a_marked_row_and_an_older_folders_attempt_match_still_holds():
    cells = [{"cell_id": "c", "attempt": "0-aa"}]
    rows = [
        {"cell_id": "c", "attempt": "0-aa", "round": 0, "valid": True},
        {"cell_id": "c", "attempt": "0-aa", "round": 1, "valid": False, "voided": "server exited"},
        {"cell_id": "c", "attempt": "dead", "round": 0, "valid": True},  # an older folder's voided attempt
    ]
    assert [r["round"] for r in counted_requests(cells, rows)] == [0]


def test_a_node_sends_the_void_to_the_driver_with_the_attempt_count_continued(tmp_path):
    sent: list[tuple] = []
    NodeStore(str(tmp_path / "run"), "p1-a.o1.abc", sent.append, offset=2).void_rows(
        "c", "0-ab", "attempt 0: server exited"
    )
    assert sent == [("void", "c", "2-ab", "attempt 2: server exited")]


def test_the_driver_applies_a_nodes_void_to_the_run_folder(tmp_path):
    from e2e.run.executors.ray_executor import RayExecutor

    class Inbox:
        def __init__(self, items: list[tuple]):
            self.items = items

        def qsize(self) -> int:
            return len(self.items)

        def get_nowait_batch(self, n: int) -> list[tuple]:
            out, self.items = self.items[:n], self.items[n:]
            return out

    store = RunStore.create(tmp_path / "r")
    with store:
        store.append(REQUESTS, _row("c", "2-ab", 0))
        ex = RayExecutor.__new__(RayExecutor)  # only what _drain reads
        ex.store, ex.flights = store, {"t": object()}
        ex.inbox = Inbox([("t", "void", "c", "2-ab", "attempt 2: server exited")])
        ex._drain()
        [row] = store.requests()
    assert row["voided"] == "attempt 2: server exited" and row["valid"] is False
