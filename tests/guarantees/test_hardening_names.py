"""A run folder is data, never a path (issue 35, item 6; a damaged voided.json, item 12): every field
read from it that becomes a file or folder name is a plain name, refused in one line (file, entry or
row, field; exit 2) before anything is written; a record's path never leads out of the folder; and
scrubbing touches only regular files. Each case runs the real CLI on a run made by the real harness
(the stand-in server of tests/support/hardening.py) and compares every file's digest before and after,
those around the run folder included (what a path in a record would have reached).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from e2e.cli import main
from e2e.errors import UserError
from e2e.rundir import store as run_store
from e2e.rundir.store import CELLS, PLAN, RunStore
from e2e.safety.redact import scrub_file
from tests.support.hardening import digest, finished_run, run_cli, run_copy, standin  # noqa: F401

# "ABS": an absolute path beside the run folder, where the digests see what a resume would write
PATHS = ["../../escape", "ABS", "a/b", "..", "x\n"]


@pytest.fixture
def unfinished(run_copy) -> Path:
    """The finished run with its last cell's row gone: --resume has a cell to run."""
    rows = (run_copy / CELLS).read_bytes().splitlines(keepends=True)
    (run_copy / CELLS).write_bytes(b"".join(rows[:-1]))
    return run_copy


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("value", PATHS)
@pytest.mark.parametrize("field", ["server_key", "cell_id", "arm"])
@pytest.mark.parametrize("command", ["report", "resume"])
def test_a_plan_entry_that_is_a_path_is_one_line_and_changes_nothing(unfinished, capsys, field, value, command):
    value = str(unfinished.parent / "escape") if value == "ABS" else value
    _edit_json(unfinished / PLAN, lambda plan: plan[-1].update({field: value}))
    around = unfinished.parent
    before = digest(around)
    rc, err = run_cli(capsys, *(["report", unfinished] if command == "report" else ["--resume", unfinished]))
    assert rc == 2, err
    assert f"{unfinished / PLAN}: entry 2: {field}: {value[:50]!r}"[:-1] in err and "is not a plain name" in err
    assert digest(around) == before  # nothing written, inside the run folder or beside it


@pytest.mark.parametrize(
    "field, value, msg",
    [
        ("server_key", "../../escape", "server_key: '../../escape' is not a plain name"),
        ("attempt", "0-ab/../../x", "attempt: '0-ab/../../x' is not a plain name"),
        ("cell_id", "/abs", "cell_id: '/abs' is not a plain name"),
        ("log_path", "/etc/passwd", "log_path: '/etc/passwd' is not a path inside the run folder"),
        ("log_path", "logs/../../x.log", "log_path: 'logs/../../x.log' is not a path inside the run folder"),
    ],
)
def test_a_cell_row_field_that_is_a_path_is_one_line(run_copy, capsys, field, value, msg):
    rows = [json.loads(x) for x in (run_copy / CELLS).read_text().splitlines()]
    rows[0][field] = value
    (run_copy / CELLS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    before = digest(run_copy.parent)
    for argv in (["report", run_copy], ["--resume", run_copy], ["compare", run_copy, run_copy]):
        rc, err = run_cli(capsys, *argv)
        assert rc == 2 and f"{run_copy / CELLS}: row 1: {msg}" in err, err
    assert digest(run_copy.parent) == before


def test_valid_names_and_paths_still_read(run_copy):
    """Not vacuous: the rows the harness writes pass the same checks (log_path logs/<key>.a<n>.log)."""
    store = RunStore(run_copy)
    assert {c["log_path"] for c in store.cells()} == {"logs/p1-d16-a.a0.log", "logs/p1-d16-b.a0.log"}
    assert [p["server_key"] for p in store.plan()] == ["p1-d16-a", "p1-d16-b"]


# -- voided.json: checked before anything is written ---------------------------------------------------
@pytest.mark.parametrize(
    "content, msg",
    [
        (b"{not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[]", "not a JSON object"),
        (b'{"at": "round 0", "foreign": []}', "attempt: Field required"),
        (b'{"attempt": "../../x", "at": "round 0"}', "attempt: '../../x' is not a plain name"),
        (b'{"attempt": "0-ab", "at": "round 0", "foreign": [{"pid": "x"}]}', "foreign.0.pid"),
    ],
)
def test_a_damaged_voided_record_is_one_line_before_resume_changes_anything(unfinished, capsys, content, msg):
    # was: --resume wrote the manifest (status, resumes), then a JSON traceback when the runner read it
    voided = unfinished / "cells" / "p1-d16-b" / "gpu-a0" / "voided.json"
    voided.parent.mkdir(parents=True)
    voided.write_bytes(content)
    before = digest(unfinished)
    rc, err = run_cli(capsys, "--resume", unfinished)
    assert rc == 2 and err.startswith(f"error: {voided}: ") and msg in err, err
    assert digest(unfinished) == before


def test_a_sound_voided_record_is_read_and_does_not_stop_a_resume(unfinished, capsys):
    from e2e.gpu.gpu_state import GpuProbe, ServerWatch

    server_dir = unfinished / "cells" / "p1-d16-b"
    (server_dir / "gpu-a0").mkdir(parents=True)
    rec = {"cell_id": "p1-d16-b", "attempt": "0-ab12cd", "at": "round 0", "foreign": [{"gpu": 0, "pid": 7}]}
    (server_dir / "gpu-a0" / "voided.json").write_text(json.dumps(rec))
    watch = ServerWatch(GpuProbe([], None, "no GPU here"), "retry", print)
    watch.read_voided(server_dir)
    assert watch.contaminated_attempts == {"p1-d16-b": [{k: rec[k] for k in ("attempt", "at", "foreign")}]}
    assert main(["--resume", str(unfinished), "--no-progress"]) == 1  # the stand-in fails its cell again
    capsys.readouterr()


# -- what the store joins, and paths named by records ---------------------------------------------------
@pytest.mark.parametrize("name", ["../x", "a/b", "", ".."])
def test_the_store_never_joins_a_name_that_is_a_path(tmp_path, name):
    store = RunStore(tmp_path)
    for join in (store.cell_dir, store.log_path, store.attempts_used):
        with pytest.raises(UserError, match="is not a plain name"):
            join(name)
    assert list(tmp_path.iterdir()) == []


def test_a_path_read_from_a_record_is_used_only_inside_the_run_folder(tmp_path):
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "s.a0.log").write_text("x")
    (tmp_path / "outside.log").write_text("x")
    (run / "logs" / "link.log").symlink_to(tmp_path / "outside.log")
    (run / "linked").symlink_to(run / "logs")
    assert run_store.inside(run, "logs/s.a0.log") == run / "logs" / "s.a0.log"
    for rel in (str(tmp_path / "outside.log"), "../outside.log", "logs/../../outside.log", "logs/link.log"):
        assert run_store.inside(run, rel) is None, rel
    for rel in ("linked/s.a0.log", "logs", "logs/missing.log", None, 3):
        assert run_store.inside(run, rel) is None, rel


# -- scrubbing touches only regular files ---------------------------------------------------------------
SECRET = "s3cr3t-value-0001"


def test_scrubbing_a_link_touches_neither_the_link_nor_its_target(tmp_path):
    # was: the target's content, scrubbed, replaced the link inside the folder
    target = tmp_path / "elsewhere.txt"
    target.write_text(f"the user's own file naming {SECRET}\n")
    log = tmp_path / "run" / "s.log"
    log.parent.mkdir()
    log.symlink_to(target)
    assert scrub_file(log, {SECRET}) is False
    assert log.is_symlink() and target.read_text() == f"the user's own file naming {SECRET}\n"


def test_scrubbing_a_fifo_returns_at_once(tmp_path):
    # was: read_bytes() on the FIFO waited for a writer forever
    fifo = tmp_path / "s.log"
    os.mkfifo(fifo)
    done: list[bool] = []
    t = threading.Thread(target=lambda: done.append(scrub_file(fifo, {SECRET})), daemon=True)
    t.start()
    t.join(5)
    if t.is_alive():  # release the blocked reader (no writer ever came), then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert done == [False]


def test_a_regular_file_is_still_scrubbed(tmp_path):
    log = tmp_path / "s.log"
    log.write_text(f"a {SECRET} b\n")
    assert scrub_file(log, {SECRET}) is True
    assert log.read_text() == "a <redacted> b\n"


def test_a_live_server_record_never_leads_scrubbing_or_deleting_out_of_the_run_folder(tmp_path):
    import hashlib

    from e2e.serve import live_servers

    key = "0123456789abcdef" * 2  # what launch.session_api_key makes: 32 hex digits
    run = tmp_path / "run"
    (run / live_servers.LIVE_DIR).mkdir(parents=True)
    outside = tmp_path / "outside.log"
    outside.write_text(f"the user's own file, holding {key}\n")
    victim = tmp_path / "victim.json"
    victim.write_text("{}")
    record = {"server_id": "../../victim", "log": str(outside), "key_sha256": hashlib.sha256(key.encode()).hexdigest()}
    (run / live_servers.LIVE_DIR / "planted.json").write_text(json.dumps(record))
    live_servers.clear_records(run)
    assert outside.read_text() == f"the user's own file, holding {key}\n"  # not scrubbed: not the run's
    assert victim.exists()  # not deleted: not the run's
