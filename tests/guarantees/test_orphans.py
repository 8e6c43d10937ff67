"""No server outlives the harness (issue 22), through the real CLI in a child process, against the
STAND-IN of tests/support/orphans.py (it ignores SIGTERM, so a teardown lasts stop_timeout_s, and it
prints its secrets): signals mid-teardown, SIGKILL of the harness and what report, --resume and the
next start do about what it left, a full disk mid-cell. Each takes seconds."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import psutil
import pytest

from e2e.cli import main
from e2e.safety.interrupts import held
from e2e.serve import live_servers, owners
from tests.support.orphans import (
    HF_TOKEN,
    kill_all,
    killed_harness,
    manifest,
    orphan_cfg,
    secrets_in,
    start_harness,
    start_run,
    tagged_processes,
    the_server,
    wait_for_line,
    wait_in_file,
    write_standin,
)

# `alone`: the tests that leave or plant an orphan and look for it next; another test's run would
# sweep it first when tests run on several workers (tests/conftest.py)


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    return write_standin(tmp_path_factory.mktemp("orphan-standin"))


@pytest.mark.parametrize("first", [signal.SIGTERM, signal.SIGINT])
def test_signals_during_teardown_never_abandon_a_server_nor_leave_a_secret(tmp_path, standin, first):
    cfg = orphan_cfg(tmp_path / "c.toml", standin)
    run = tmp_path / "t"
    p, seen = start_run(cfg, tmp_path, "t")
    try:
        wait_for_line(p, "measuring", seen, timeout=60)
        key = the_server(run).environ()["VLLM_API_KEY"]
        log = next((run / "logs").glob("*.log"))
        assert key in log.read_text() and HF_TOKEN in log.read_text()  # the stand-in printed them
        p.send_signal(first)  # the interrupt: teardown begins (the stand-in ignores SIGTERM for 3 s)
        wait_in_file(log, "got SIGTERM")
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGINT, signal.SIGTERM):
            p.send_signal(sig)  # more interrupts, mid-teardown: held until the server is gone
            time.sleep(0.2)
        out = p.communicate(timeout=60)[0]
        left = tagged_processes(run)
        assert not left, f"left running: {[x.cmdline() for x in left]}\n{''.join(seen) + out}"
        assert p.returncode == 130, "".join(seen) + out
        assert manifest(run)["status"] == "interrupted"
        assert not secrets_in(run, [key, HF_TOKEN])
        assert not (run / "live-servers").exists()  # every record dropped with its server
    finally:
        p.kill()
        kill_all(tagged_processes(run))


@pytest.mark.alone
def test_after_a_sigkill_report_and_resume_say_the_harness_died_and_resume_stops_its_server(tmp_path, standin, capsys):
    run, env = killed_harness(tmp_path, standin, "k")
    sid = env["E2E_SERVER_ID"]
    p = None
    try:
        assert manifest(run)["status"] == "running"
        assert main(["report", str(run)]) == 0
        assert json.loads((run / "summary.json").read_text())["run"]["status"] == "harness-died"
        assert "| run status | harness-died" in (run / "report.md").read_text()
        assert (run / "live-servers" / f"{sid}.json").is_file()  # the record the next start goes by
        p, seen = start_harness("--resume", run)
        wait_for_line(p, "measuring", seen)  # the rest runs on a fresh server: the orphan is gone by now
        text = "".join(seen)
        assert "the harness of this run died" in text and "stopped what a harness that died left" in text, text
        m = manifest(run)
        assert m["resumes"][-1]["status_before"] == "harness-died" and m["harness_died"]["found"]
        [entry] = m["orphans_stopped"]
        assert entry["server_id"] == sid and entry["still_running"] == [] and entry["pids"]
        assert not [x for x in tagged_processes(run) if x.environ()["E2E_SERVER_ID"] == sid]
        assert not (run / "live-servers" / f"{sid}.json").exists()
        p.send_signal(signal.SIGINT)
        out = p.communicate(timeout=60)[0]
        assert p.returncode == 130, text + out
        assert not tagged_processes(run)
        assert not secrets_in(run, [env["VLLM_API_KEY"], HF_TOKEN])  # the dead harness's key too
    finally:
        if p:
            p.kill()
        kill_all(tagged_processes(run))


@pytest.mark.alone
def test_the_next_start_elsewhere_stops_what_a_dead_harness_left_and_marks_its_run(tmp_path, standin):
    dead, env = killed_harness(tmp_path, standin, "dead")
    try:
        cfg = orphan_cfg(
            tmp_path / "next.toml", standin, workload={"rounds": 3}, server={"env": {"STANDIN_DECODE_MS": "1"}}
        )
        p, _ = start_run(cfg, tmp_path, "next")
        out = p.communicate(timeout=120)[0]
        assert p.returncode == 0, out
        assert f"stopped what a harness that died left running: 1 server(s) of {dead.resolve()}" in out, out
        [entry] = manifest(tmp_path / "next")["orphans_stopped"]
        assert entry["tag"] == env["E2E_SERVER_TAG"] and entry["owner"] == env["E2E_HARNESS"]
        m = manifest(dead)
        assert m["status"] == "harness-died" and m["orphans_stopped"][0]["server_id"] == env["E2E_SERVER_ID"]
        assert not tagged_processes(dead) and not tagged_processes(tmp_path / "next")
        assert not secrets_in(dead, [env["VLLM_API_KEY"], HF_TOKEN])
    finally:
        kill_all(tagged_processes(dead))


@pytest.mark.alone
def test_a_record_whose_server_died_too_has_its_log_scrubbed_of_the_key_found_by_its_digest(tmp_path, standin):
    run, env = killed_harness(tmp_path, standin, "gone")
    kill_all(tagged_processes(run))  # the server dies too (OOM, a reboot): only its record is left
    time.sleep(0.5)
    assert len(secrets_in(run, [env["VLLM_API_KEY"], HF_TOKEN])) == 2
    p, seen = start_harness("--resume", run)
    try:
        wait_for_line(p, "measuring", seen)
        assert "the harness of this run died" in "".join(seen)
        assert not (run / "live-servers" / f"{env['E2E_SERVER_ID']}.json").exists()
        assert not secrets_in(run, [env["VLLM_API_KEY"]])  # this harness never knew that key
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=60)
        assert p.returncode == 130
        assert not secrets_in(run, [env["VLLM_API_KEY"], HF_TOKEN])
    finally:
        p.kill()
        kill_all(tagged_processes(run))


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs: a disk that really fills up. Needs mount rights (root); skipped elsewhere."""
    d = tmp_path / "disk"
    d.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(d)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    yield d
    subprocess.run(["umount", "-l", str(d)], capture_output=True)


def test_a_disk_full_mid_cell_stops_the_server_and_leaves_no_secret(tmp_path, standin, small_disk):
    cfg = orphan_cfg(tmp_path / "c.toml", standin)
    run = small_disk / "f"
    p, seen = start_run(cfg, small_disk, "f")
    try:
        wait_for_line(p, "measuring", seen)
        key = the_server(run).environ()["VLLM_API_KEY"]
        with open(small_disk / "filler", "wb") as f:  # every byte left: the next row cannot be written
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        out = p.communicate(timeout=60)[0]
        assert not tagged_processes(run)
        assert not secrets_in(run, [key, HF_TOKEN])  # scrubbed in place: scrub_file's copy had no room
        assert not list((run / "logs").glob(".*scrub*"))
        assert p.returncode == 2 and "disk full" in out, "".join(seen) + out
    finally:
        p.kill()
        kill_all(tagged_processes(run))


# -- the pieces, in-process -------------------------------------------------------------------------
def test_held_keeps_a_signal_that_a_worker_thread_takes_until_the_block_ends():
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)  # a thread the kernel may hand the signal to
    worker.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            with held() as h:
                signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # only the worker can take it
                try:
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(0.2)
                finally:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
                time.sleep(0.1)  # the handler ran: it only noted the signal
                assert h.got == [signal.SIGINT]
        with held(redeliver=False) as h:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.1)
        assert h.got == [signal.SIGINT]  # noted, not delivered: the caller is stopping already
    finally:
        stop.set()
        worker.join()


def test_scrub_log_on_a_full_disk_overwrites_in_place(tmp_path, monkeypatch):
    import os as _os

    from e2e.safety import redact

    data = b"key=0123456789abcdef0123456789abcdef token=hf_abcdefgh tail\n"
    log = tmp_path / "s.log"
    log.write_bytes(data)
    real = _os.fdopen

    class Full:
        """The scrubbed copy's file: 5 bytes land, then the disk is full."""

        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, b):
            self.f.write(b[:5])
            self.f.flush()
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(redact.os, "fdopen", lambda fd, *a, **k: Full(real(fd, *a, **k)))
    live_servers.scrub_log(log, ["0123456789abcdef0123456789abcdef", "hf_abcdefgh"])
    got = log.read_bytes()
    assert len(got) == len(data) and b"0123456789abcdef" not in got and b"hf_abcdefgh" not in got
    assert got.startswith(b"key=<redacted>") and got.endswith(b" tail\n")  # masked in place
    assert [p.name for p in tmp_path.iterdir()] == ["s.log"]  # the half-written copy is gone


@pytest.mark.alone
def test_a_dead_harness_s_ray_processes_are_stopped_and_a_live_one_s_are_not():
    """Stand-ins for what a Ray cluster leaves when its driver dies (seen: a DashboardAgent after
    ray.init failed): a process carrying E2E_RAY_CLUSTER of its dead owner, and one found only by
    the cluster's record (Ray's agents overwrite their environment with their process title)."""
    dead = subprocess.Popen(["sleep", "0"])
    dead.wait()
    dead_id = f"{socket.gethostname()}/{owners.boot_id()}/{owners.pid_namespace()}/{dead.pid}/1"  # ran here, gone
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    agent = subprocess.Popen(sleeper, env={**os.environ, live_servers.CLUSTER_ENV: dead_id})
    hidden = subprocess.Popen(sleeper, env={})  # an agent whose environment says nothing: only recorded
    mine = subprocess.Popen(sleeper, env={**os.environ, live_servers.CLUSTER_ENV: live_servers.identity()})
    record = live_servers.cluster_record_path(dead_id)
    try:
        time.sleep(0.3)
        record.write_text(
            json.dumps(
                {"owner": dead_id, "pids": [[hidden.pid, psutil.Process(hidden.pid).create_time()], [mine.pid, 0.0]]}
            )
        )  # a reused pid: not it
        stopped = live_servers.stop_orphans()
        assert sorted((e["kind"], e["owner"], p) for e in stopped for p in e["pids"]) == sorted(
            [("ray-cluster", dead_id, agent.pid), ("ray-cluster", dead_id, hidden.pid)]
        )
        for x in (agent, hidden):
            x.wait(timeout=10)  # reaped already by the stop (it is our child here)
            assert not psutil.pid_exists(x.pid)
        assert mine.poll() is None and not record.exists()
        assert "2 process(es) of its Ray cluster" in live_servers.describe(stopped)
    finally:
        record.unlink(missing_ok=True)
        for x in (agent, hidden, mine):
            x.kill()
            x.wait()
