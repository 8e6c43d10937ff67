"""The run folder is a closed world (issue 22, round two of hardening).

- A symlink anywhere in a run folder is refused with one line naming it, exit 2, before anything is
  written: `--resume` (the lock, the rows, the server logs, the per-cell folders) and `report`.
- A link planted after that check still cannot redirect a write: appends and server logs are opened
  with O_NOFOLLOW, and report files are written to a new name and renamed over the old (a rename
  replaces a link or a hard link, never writes through it).
- twin / assets never delete a folder the tool did not make.

No real server is needed: every case is refused before a server would start, or (the resume cases)
the stand-in `server.python` of tests/support/hardening.py is launched the way vLLM is and exits at
once, which is what made the old code write its output through the planted links.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from e2e.cli import main
from e2e.errors import UserError
from e2e.rundir.formats import cell_row
from e2e.rundir.store import CELLS, REQUESTS, RunStore
from e2e.twin.stamp import STAMP
from tests.support import ROOT
from tests.support.hardening import digest, finished_run, one_line, run_cli, run_copy, standin  # noqa: F401

SMOLLM2 = ROOT / "assets" / "SmolLM2-135M-Instruct"
OUTSIDE = b"root:x:0:0:root:/root:/bin/bash\n"  # a file outside the run folder (a copy of /etc/passwd)
TINY = [
    "--set",
    "num_hidden_layers=1",
    "--set",
    "hidden_size=128",
    "--set",
    "intermediate_size=256",
    "--set",
    "num_attention_heads=1",
    "--set",
    "num_key_value_heads=1",
    "--set",
    "vocab_size=256",
]


def snapshot(path: Path) -> object:
    """Everything under path, links not followed: names, kinds and bytes."""
    if not path.is_dir():
        return path.read_bytes()
    out = []
    for d, dirs, files in os.walk(path):
        for n in sorted(dirs + files):
            p = Path(d) / n
            out.append((str(p.relative_to(path)), p.read_bytes() if p.is_file() and not p.is_symlink() else None))
    return sorted(out, key=lambda x: x[0])


def plant_link(run: Path, name: str, outside: Path, is_dir: bool) -> None:
    """Replace run/name with a symlink to `outside` (made here: an empty folder; a file holding
    OUTSIDE, or nothing for a row file, which the old code then read as valid and appended to)."""
    if is_dir:
        outside.mkdir()
    else:
        outside.write_bytes(b"" if name.endswith(".jsonl") else OUTSIDE)
    link = run / name
    if link.is_dir():
        import shutil

        shutil.rmtree(link)
    elif link.exists():
        link.unlink()
    link.symlink_to(outside)


# -- --resume: every file and folder it writes -------------------------------------------------------
@pytest.mark.parametrize(
    "name, is_dir",
    [
        (".lock", False),  # was truncated to the resuming process's pid
        (CELLS, False),  # received the resumed cells' rows
        (REQUESTS, False),  # would receive request rows
        ("logs", True),  # received the servers' output
        ("cells", True),  # received the per-cell folders
        ("logs/p1-d16-a.a0.log", False),  # received server output appended (the /etc/passwd copy)
    ],
)
def test_resume_refuses_a_symlink_in_the_run_folder(run_copy, tmp_path, capsys, name, is_dir):
    (run_copy / CELLS).write_bytes(b"")  # no cell finished: --resume starts both cells' servers again
    outside = tmp_path / "outside"
    plant_link(run_copy, name, outside, is_dir)
    before, inside = snapshot(outside), snapshot(run_copy)
    rc = main(["--resume", str(run_copy)])
    assert snapshot(outside) == before and snapshot(run_copy) == inside  # nothing written, in or out
    assert rc == 2 and f"{run_copy / name}: is a symlink" in one_line(capsys)


def test_a_symlinked_file_deeper_in_a_subfolder_is_named(run_copy, tmp_path, capsys):
    (run_copy / "cells" / "p1-d16-b" / "records-a0").mkdir()
    plant_link(run_copy, "cells/p1-d16-b/records-a0/x.json", tmp_path / "outside", False)
    rc, err = run_cli(capsys, "report", run_copy)
    assert rc == 2 and f"{run_copy}/cells/p1-d16-b/records-a0/x.json: is a symlink" in err


# -- report: every file it writes, and the gsm8k folder it copies from --------------------------------
@pytest.mark.parametrize(
    "name, is_dir",
    [
        ("report.md", False),
        ("summary.csv", False),
        ("decode_vs_depth.png", False),
        ("summary.json", False),
        ("gsm8k", True),  # the report copied the outside folder's summaries into summary.json
    ],
)
def test_report_refuses_a_symlink_in_the_run_folder(run_copy, tmp_path, capsys, name, is_dir):
    outside = tmp_path / "outside"
    plant_link(run_copy, name, outside, is_dir)
    if is_dir:
        (outside / "summary.json").write_text(json.dumps({"from": "outside the run folder"}))
    before, inside = snapshot(outside), snapshot(run_copy)
    rc = main(["report", str(run_copy)])
    assert snapshot(outside) == before and snapshot(run_copy) == inside  # nothing written, in or out
    assert rc == 2 and f"{run_copy / name}: is a symlink" in one_line(capsys)


# -- a link planted after the check: the writers themselves do not follow it --------------------------
def _row(cell_id: str) -> dict:
    return cell_row(cell_id=cell_id, attempt="0", pass_=1, arm="a", depth=1, status="ok")


@pytest.mark.parametrize("name", [CELLS, REQUESTS])
def test_an_append_does_not_follow_a_link_planted_while_open(tmp_path, name):
    outside = tmp_path / "outside"
    with RunStore.create(tmp_path / "r") as s:
        plant_link(s.root, name, outside, False)
        with pytest.raises(UserError, match=f"{s.root / name}: is a symlink"):
            s.append(name, _row("a"))
    assert outside.read_bytes() == b""


def test_a_server_log_is_not_opened_through_a_link(tmp_path, standin):
    from e2e.serve.server import ServerSpec, VllmServer

    log = tmp_path / "server.log"
    plant_link(tmp_path, "server.log", tmp_path / "outside", False)
    srv = VllmServer(ServerSpec(python=str(standin), model="m"), log)
    with pytest.raises(UserError, match=f"{log}: is a symlink"):
        srv.start()
    assert srv.proc is None and (tmp_path / "outside").read_bytes() == OUTSIDE


def test_report_files_are_replaced_by_rename_never_written_in_place(tmp_path, capsys):
    """A hard link outside the folder (which the symlink check cannot see) keeps its bytes. (A run
    folder with measured cells, so that both figures are drawn too.)"""
    from tests.support.synthetic import make_run

    run_copy = make_run(tmp_path / "run", {"stock": 2.0, "widened": 2.2})
    assert main(["report", str(run_copy)]) == 0
    names = ["report.md", "summary.csv", "comparisons.csv", "summary.json", "decode_vs_depth.png", "ratio_vs_depth.png"]
    for n in names:
        os.link(run_copy / n, tmp_path / n)
    old = {n: (tmp_path / n).read_bytes() for n in names}
    assert main(["report", str(run_copy)]) == 0
    capsys.readouterr()
    for n in names:
        assert (tmp_path / n).read_bytes() == old[n], n
        assert not os.path.samefile(run_copy / n, tmp_path / n), n
        assert (run_copy / n).stat().st_size > 0
    assert not [p.name for p in run_copy.iterdir() if ".tmp-" in p.name]  # no temporary left


def test_a_writer_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    from e2e.report import tables

    path = tmp_path / "t.csv"
    tables.write_csv(path, [{"a": 1}], ["a"], 1)
    old = path.read_bytes()

    def rows():
        yield {"a": 2}
        raise RuntimeError("the writer dies half-way")

    with pytest.raises(RuntimeError):
        tables.write_csv(path, rows(), ["a"], 1)
    assert path.read_bytes() == old and sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]


def test_an_append_refuses_a_hard_linked_row_file(tmp_path):
    """A hard link (a `cp -al` backup of the run) would receive the rows too."""
    with RunStore.create(tmp_path / "r") as s:
        s.append(CELLS, _row("a"))
    os.link(tmp_path / "r" / CELLS, tmp_path / "backup.jsonl")
    before = (tmp_path / "backup.jsonl").read_bytes()
    with RunStore(tmp_path / "r") as s:
        with pytest.raises(UserError, match="has another hard link"):
            s.append(CELLS, _row("b"))
    assert (tmp_path / "backup.jsonl").read_bytes() == before


def test_legitimate_folders_still_work(tmp_path):
    """A run folder reached through a link (results/latest -> a run) and a results root that is a
    link are the user's own choice: only links inside the run folder are refused."""
    real = tmp_path / "disk" / "r"
    with RunStore.create(real) as s:
        s.append(CELLS, _row("a"))
    (tmp_path / "latest").symlink_to(real)
    with RunStore(tmp_path / "latest") as s:
        s.append(CELLS, _row("b"))
        assert [r["cell_id"] for r in s.cells()] == ["a", "b"]


# -- twin / assets: nothing deleted that the tool did not make --------------------------------------
def _twin(out: Path, *extra: str) -> int:
    return main(["twin", "--like", "gemma-3-27b-it-w4a16", *TINY, "--out", str(out), *extra])


def test_twin_out_refuses_an_unrelated_non_empty_folder(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("keep me")
    assert _twin(out) == 2
    assert f"--out {out}: not empty and not a folder this tool made" in one_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # no .partial either
    assert [p.name for p in out.iterdir()] == ["thesis.tex"] and (out / "thesis.tex").read_text() == "keep me"


def test_assets_random_out_refuses_an_unrelated_non_empty_folder(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert (
        main(
            [
                "assets",
                "random",
                "--like",
                str(SMOLLM2 / "config.json"),
                "--tokenizer-from",
                str(SMOLLM2),
                *TINY,
                "--out",
                str(out),
            ]
        )
        == 2
    )
    assert f"--out {out}: not empty and not a folder this tool made" in one_line(capsys)
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "keep me"


def test_twin_out_refuses_a_file_and_a_symlink(tmp_path, capsys):
    (tmp_path / "f").write_text("keep me")
    assert _twin(tmp_path / "f") == 2 and "is not a folder" in one_line(capsys)
    (tmp_path / "d").mkdir()
    (tmp_path / "l").symlink_to(tmp_path / "d")
    assert _twin(tmp_path / "l") == 2 and "is a symlink" in one_line(capsys)
    assert (tmp_path / "f").read_text() == "keep me" and (tmp_path / "l").is_symlink()


def test_a_partial_folder_not_made_by_the_tool_is_kept(tmp_path, capsys):
    (tmp_path / "t.partial").mkdir()
    (tmp_path / "t.partial" / "x").write_text("keep me")
    assert _twin(tmp_path / "t") == 2
    assert f"{tmp_path / 't.partial'}: not empty and not a folder this tool made" in one_line(capsys)
    assert (tmp_path / "t.partial" / "x").read_text() == "keep me" and not (tmp_path / "t").exists()


def test_the_tools_own_folders_are_still_rebuilt(tmp_path, capsys):
    """An empty folder, a stamped twin with --force, and a half-built .partial the tool left."""
    out = tmp_path / "t"
    out.mkdir()
    assert _twin(out) == 0 and (out / STAMP).is_file()
    first = (out / "model.safetensors").stat().st_ino
    (tmp_path / "t.partial").mkdir()
    from e2e.twin.stamp import PARTIAL

    (tmp_path / "t.partial" / PARTIAL).write_text("")
    (tmp_path / "t.partial" / "model.safetensors").write_bytes(b"half")
    assert _twin(out, "--force") == 0
    assert (out / "model.safetensors").stat().st_ino != first and not (out / PARTIAL).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]
    capsys.readouterr()


def test_assets_model_refuses_an_unrelated_folder_of_its_name(tmp_path):
    from e2e import assets

    out = tmp_path / assets.PINS["smollm2"]["folder"]
    out.mkdir()
    (out / "weights.bin").write_text("keep me")
    with pytest.raises(UserError, match="not empty and not a folder this tool made"):
        assets.build_model("smollm2", tmp_path)  # refused before anything is fetched
    assert [p.name for p in tmp_path.iterdir()] == [out.name] and (out / "weights.bin").read_text() == "keep me"


def test_pack_tokenizer_refuses_a_folder_it_did_not_make(tmp_path, capsys):
    out = tmp_path / "model"
    out.mkdir()
    (out / "tokenizer.json").write_text("my own tokenizer")
    (out / "model.safetensors").write_text("weights")
    src = tmp_path / "src"
    src.mkdir()
    (src / "tokenizer.json").write_text('{"model": {}}')
    assert main(["twin", "--pack-tokenizer", str(src), "--out", str(out)]) == 2
    assert f"--out {out}: not empty and not a folder this tool made" in one_line(capsys)
    assert (out / "tokenizer.json").read_text() == "my own tokenizer"
    packed = tmp_path / "tok"
    assert main(["twin", "--pack-tokenizer", str(src), "--out", str(packed)]) == 0
    (src / "tokenizer.json").write_text('{"model": {"v": 2}}')
    assert main(["twin", "--pack-tokenizer", str(src), "--out", str(packed)]) == 0  # its own: repacked
    assert (packed / "tokenizer.json").read_text() == '{"model": {"v": 2}}'
    capsys.readouterr()


def test_the_log_scrub_never_writes_through_a_link_planted_at_its_temporary_name(tmp_path):
    """scrub_file writes its scrubbed copy beside the log under a fixed name: a link planted there
    (before the scrub) must not receive the copy; the log is masked in place instead."""
    from e2e.safety.redact import scrub_file

    log = tmp_path / "server.log"
    log.write_bytes(b"key sk-supersecret-1234 in the log\n")
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"keep me\n")
    import os

    (tmp_path / f".server.log.scrub-{os.getpid()}").symlink_to(outside)
    assert scrub_file(log, ["sk-supersecret-1234"]) is True
    assert outside.read_bytes() == b"keep me\n"
    assert b"sk-supersecret-1234" not in log.read_bytes()


def test_gsm8k_files_are_written_without_following_links(tmp_path):
    from e2e.accuracy import tasks

    out = tmp_path / "tasks"
    out.mkdir()
    outside = tmp_path / "outside.yaml"
    outside.write_text("keep\n")
    t = "gsm8k_cot_offline"
    (out / f"{t}.yaml").symlink_to(outside)
    data = tmp_path / "test.jsonl"
    data.write_text('{"question": "q", "answer": "a"}\n')
    tasks.render_tasks([t], data, out)
    assert outside.read_text() == "keep\n"  # the link was replaced, not written through
    assert not (out / f"{t}.yaml").is_symlink()
