"""The orphan sweep stops only what proves it is one of its servers (issue 35 items 1, 2, 3, 5).

Every victim here is a `setsid sleep` this test spawns. Where a planted record names a process
group the test did not start (1, the test's own, its parent's), every signal call is replaced by a
recorder first: a failure of the code under test must never signal anything real.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from e2e.serve import live_servers, owners
from e2e.serve.server_proof import group_refusal
from tests.support import ROOT

# orphans left or planted on purpose: another test's run would sweep them (tests/conftest.py)
pytestmark = pytest.mark.alone


@pytest.fixture
def signals(monkeypatch):
    """Every way a sweep signals, recorded and never sent."""
    sent: list[tuple[str, int]] = []
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: sent.append(("killpg", pgid)))
    monkeypatch.setattr(os, "kill", lambda pid, sig: sent.append(("kill", pid)))
    monkeypatch.setattr(psutil.Process, "kill", lambda self: sent.append(("kill", self.pid)))
    monkeypatch.setattr(psutil.Process, "send_signal", lambda self, sig: sent.append(("kill", self.pid)))
    return sent


def _victim(env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """A sleep in a session of its own, with `env` added to an environment free of E2E_ marks."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("E2E_")}
    return subprocess.Popen(["setsid", "sleep", "60"], env={**base, **(env or {})})


def _leader(p: subprocess.Popen[bytes]) -> int:
    """setsid forks when it is a group leader already: the sleep is the session's leader either way."""
    for _ in range(100):
        kids = [p.pid] + [c.pid for c in psutil.Process(p.pid).children()]
        for pid in kids:
            try:
                if os.getsid(pid) == pid and psutil.Process(pid).name() == "sleep":
                    return pid
            except (OSError, psutil.Error):
                pass
        psutil.wait_procs([], timeout=0.02)
    raise AssertionError("the sleep never led its session")


_KILL = os.kill  # the real one: the `signals` fixture replaces os.kill


def _stop(*procs: subprocess.Popen[bytes]) -> None:
    for p in procs:
        try:
            pids = [p.pid] + [c.pid for c in psutil.Process(p.pid).children()]
        except psutil.Error:
            pids = [p.pid]
        for pid in pids:
            try:
                _KILL(pid, signal.SIGKILL)
            except OSError:
                pass
        p.wait()


def _started(pid: int) -> float:
    """pid's wall-clock start, as a record of the earlier format keeps it; 0.0 where pid is gone: a
    group outlives its leader (a test command run from a background shell that has exited)."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return 0.0


def _record(run, server_id: str, pgid: int, **extra: object) -> None:
    live_servers.record(run / live_servers.LIVE_DIR, server_id, {"tag": f"{run}::c", "pgid": pgid, **extra})


def _server_env(run, server_id: str, key: str = "c") -> dict[str, str]:
    return {live_servers.SERVER_ENV: server_id, **live_servers.run_marks(str(run.resolve()), key)}


@pytest.mark.parametrize("which", ["one", "own", "parent"])
def test_a_planted_record_naming_a_group_not_its_server_s_is_refused_without_a_signal(tmp_path, signals, which):
    # was: clear_records SIGKILLed any group whose pid ran with the recorded start time: pgid 1 was
    # every process the user could signal, the harness's own group killed the harness silently
    pgid = {"one": 1, "own": os.getpgrp(), "parent": os.getpgid(os.getppid())}[which]
    _record(tmp_path, "s1", pgid, pid=pgid, pid_started=_started(pgid))
    _record(tmp_path, "s2", pgid, pid=pgid, **owners.process_identity(pgid))
    entries = live_servers.clear_records(tmp_path)
    assert signals == []
    assert [e["kind"] for e in entries] == ["left-alone", "left-alone"]
    lines = live_servers.describe(entries).splitlines()
    assert len(lines) == 2 and all(f"group {pgid}" in ln and "nothing was signalled" in ln for ln in lines)
    assert sorted(p.name for p in (tmp_path / live_servers.LIVE_DIR).iterdir()) == ["s1.json", "s2.json"]


_IN_A_LEADERLESS_GROUP = """
import json, os, sys
from pathlib import Path
import psutil
from e2e.serve import live_servers, owners
from e2e.serve.server_proof import group_refusal

ROOT = Path(__file__).resolve().parent.parent

run = Path(sys.argv[1])
own, parent = os.getpgrp(), os.getpgid(os.getppid())
leader_alive = psutil.pid_exists(own)  # before os.kill is replaced: pid_exists asks it
sent = []  # every way a sweep signals, recorded and never sent
os.killpg = lambda pgid, sig: sent.append(pgid)
os.kill = lambda pid, sig: sent.append(pid)
psutil.Process.kill = lambda self: sent.append(self.pid)
psutil.Process.send_signal = lambda self, sig: sent.append(self.pid)
for sid, pgid in (("own", own), ("parent", parent)):
    live_servers.record(run / live_servers.LIVE_DIR, sid, {"tag": f"{run}::c", "pgid": pgid, "pid": pgid, "pid_started": 0.0})
    live_servers.record(run / live_servers.LIVE_DIR, sid + "-ticks", {"tag": f"{run}::c", "pgid": pgid, "pid": pgid, **owners.process_identity(pgid)})
entries = live_servers.clear_records(run)
out = {"leader_alive": leader_alive, "refusals": [group_refusal(own), group_refusal(parent)],
       "kinds": [e["kind"] for e in entries], "orphans": len(live_servers.find_orphans(str(run))), "sent": sent}
(run / "answer.json").write_text(json.dumps(out))
"""


def test_a_sweep_from_a_group_whose_leader_exited_answers(tmp_path):
    """Launched as a test command from a background shell that has exited: this process's group has
    no leader. The sweep's checks answer (refused, nothing signalled) instead of raising."""
    script = tmp_path / "check.py"
    script.write_text(_IN_A_LEADERLESS_GROUP)
    run = tmp_path / "run"
    run.mkdir()
    # setsid: a group of its own, led by the shell, which exits before the check starts; the check's
    # parent, a subshell, stays in that group
    cmd = f"(sleep 0.5; {sys.executable} {script} {run} 2> {run}/err) & exit 0"
    subprocess.run(["setsid", "bash", "-c", cmd], cwd=ROOT, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    answer, err = run / "answer.json", run / "err"
    deadline = time.monotonic() + 60
    while not answer.exists() and time.monotonic() < deadline:
        if err.exists() and err.stat().st_size:  # it raised
            time.sleep(0.5)
            break
        time.sleep(0.1)
    assert answer.exists(), err.read_text() if err.exists() else "no answer in 60 s"
    got = json.loads(answer.read_text())
    assert got["leader_alive"] is False  # the case: a group whose leader has exited
    assert all(r is not None for r in got["refusals"]) and got["sent"] == []
    assert got["kinds"] == ["left-alone"] * 4 and got["orphans"] == 0


def test_group_refusal_names_what_is_never_signalled():
    assert "group 0" in group_refusal(0) and "group 1" in group_refusal(1)
    assert "own" in group_refusal(os.getpgrp()) and group_refusal(os.getpgid(os.getppid())) is not None
    assert "no process group" in group_refusal(True) and "no process group" in group_refusal("7")


def test_a_record_naming_a_live_process_that_is_not_its_server_leaves_it_running(tmp_path):
    """Its own session, this user's, the recorded start: but its environment is not that server's."""
    stranger = _victim()
    other_run = _victim(_server_env(tmp_path / "elsewhere", "s1"))
    try:
        a, b = _leader(stranger), _leader(other_run)
        _record(tmp_path, "s1", a, pid=a, **owners.process_identity(a))
        _record(tmp_path, "s2", b, pid=b, pid_started=psutil.Process(b).create_time())  # earlier format
        entries = live_servers.clear_records(tmp_path)
        assert [e["kind"] for e in entries] == ["left-alone", "left-alone"]
        assert all("not that server of this run" in e["why"] for e in entries)
        assert stranger.poll() is None and psutil.pid_exists(a) and psutil.pid_exists(b)
    finally:
        _stop(stranger, other_run)


@pytest.mark.parametrize("fmt", ["ticks", "earlier"])
def test_a_record_whose_process_proves_it_is_that_server_has_its_group_killed(tmp_path, fmt):
    server = _victim(_server_env(tmp_path, "s1"))
    try:
        pid = _leader(server)
        ident = owners.process_identity(pid) if fmt == "ticks" else {"pid_started": psutil.Process(pid).create_time()}
        _record(tmp_path, "s1", pid, pid=pid, **ident)
        [entry] = live_servers.clear_records(tmp_path)
        assert entry["by"] == "record" and entry["pids"] == [pid]
        psutil.wait_procs([psutil.Process(pid)], timeout=10)
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        assert not (tmp_path / live_servers.LIVE_DIR).exists()
    finally:
        _stop(server)


def test_a_record_of_a_reused_pid_or_another_boot_is_stale_and_dropped(tmp_path, signals):
    stranger = _victim()
    try:
        pid = _leader(stranger)
        _record(tmp_path, "s1", pid, pid=pid, **{**owners.process_identity(pid), "pid_ticks": 1})
        _record(tmp_path, "s2", pid, pid=pid, **{**owners.process_identity(pid), "boot_id": "another"})
        assert live_servers.clear_records(tmp_path) == [] and signals == []
        assert not (tmp_path / live_servers.LIVE_DIR).exists()
    finally:
        _stop(stranger)


def test_a_record_of_another_pid_namespace_is_left_alone(tmp_path, signals):
    _record(tmp_path, "s1", 4242, pid=4242, **{**owners.process_identity(os.getpid()), "pid_ns": 1})
    [entry] = live_servers.clear_records(tmp_path)
    assert entry["kind"] == "left-alone" and "another pid namespace" in entry["why"] and signals == []


def test_a_clock_step_never_makes_a_live_harness_look_dead(monkeypatch):
    # was: the owner was <host>/<pid>/<psutil create_time>, matched within 0.05 s: a step of the
    # boot time psutil reads (18 s seen) made a live harness's servers orphans
    harness = _victim()
    owner = owners.identity(_leader(harness))
    server = _victim({live_servers.SERVER_ENV: "s1", live_servers.HARNESS_ENV: owner})
    try:
        _leader(server)
        real = psutil.Process.create_time
        monkeypatch.setattr(psutil.Process, "create_time", lambda self: real(self) + 18.0)
        monkeypatch.setattr(psutil, "boot_time", lambda: 18.0)
        assert live_servers.owner_alive(owner) is True
        assert not [o for o in live_servers.find_orphans() if o.server_id == "s1"]
        harness.kill()
        harness.wait()
        assert live_servers.owner_alive(owner) is False
        assert [o.server_id for o in live_servers.find_orphans() if o.server_id == "s1"] == ["s1"]
    finally:
        _stop(harness, server)


def test_an_owner_in_another_pid_namespace_or_of_the_earlier_format_is_never_taken_for_dead():
    # was: a harness in a container of its own pid namespace, with the host's name (--network host),
    # was taken for dead by a harness on the host: its pid means nothing here
    gone = subprocess.Popen(["true"])
    gone.wait()
    host, boot, ns = socket.gethostname(), owners.boot_id(), owners.pid_namespace()
    other_ns = f"{host}/{boot}/{ns + 1}/{gone.pid}/12345"
    earlier = f"{host}/{gone.pid}/{psutil.boot_time() + 1:.2f}"
    server = _victim({live_servers.SERVER_ENV: "s1", live_servers.HARNESS_ENV: other_ns})
    old = _victim({live_servers.SERVER_ENV: "s2", live_servers.HARNESS_ENV: earlier})
    try:
        _leader(server), _leader(old)
        assert live_servers.owner_alive(other_ns) is None and live_servers.owner_alive(earlier) is None
        assert live_servers.owner_alive(f"{host}/other-boot/{ns}/{gone.pid}/1") is None
        assert live_servers.owner_alive(f"{host}/{boot}/{ns}/{gone.pid}/1") is False
        assert not [o for o in live_servers.find_orphans() if o.server_id in ("s1", "s2")]
    finally:
        _stop(server, old)


def test_an_owner_is_alive_only_while_that_very_process_runs():
    me = live_servers.identity()
    assert live_servers.owner_alive(me) is True
    host, boot, ns, pid, ticks = me.split("/")
    assert live_servers.owner_alive(f"{host}/{boot}/{ns}/{pid}/{int(ticks) - 1}") is False  # a reused pid
    assert live_servers.owner_alive(f"{host}/{boot}/{ns}/999999999/{ticks}") is False
    assert live_servers.owner_alive(None) is None and live_servers.owner_alive("junk") is None


def test_a_folder_holding_double_colons_never_names_another_run_s_servers(tmp_path):
    # was: a server was of run R when its tag started with "R::": run "a"'s --resume killed a live
    # server of run "a::b" (the sweep of a run whose lock is held takes every server of it)
    a, ab = str(tmp_path / "a"), str(tmp_path / "a::b")
    marked = _victim({live_servers.SERVER_ENV: "s1", **live_servers.run_marks(ab, "c")})
    legacy = _victim({live_servers.SERVER_ENV: "s2", live_servers.TAG_ENV: f"{ab}::c"})  # an earlier server
    try:
        _leader(marked), _leader(legacy)
        assert not [o for o in live_servers.find_orphans(a) if o.server_id in ("s1", "s2")]
        assert sorted(o.server_id for o in live_servers.find_orphans(ab) if o.server_id in ("s1", "s2")) == ["s1", "s2"]
        assert {o.run_root for o in live_servers.find_orphans(ab) if o.server_id in ("s1", "s2")} == {ab}
    finally:
        _stop(marked, legacy)


def test_run_marks_match_the_whole_folder_and_key():
    env = live_servers.run_marks("/r/a::b", "c")
    assert owners.run_of(env) == "/r/a::b"
    assert owners.of_run(env, "/r/a::b") and owners.of_run(env, "/r/a::b", "c")
    assert not owners.of_run(env, "/r/a") and not owners.of_run(env, "/r/a::b", "d")
    assert not owners.of_run(env, "/r/a", "b::c")
    assert owners.run_of({live_servers.TAG_ENV: "/r/a::b::c"}) == "/r/a::b"  # earlier format: the last '::'
    assert owners.run_of({}) is None and owners.run_of({**env, live_servers.RUN_ENV: "0" * 32}) is None


def test_the_ray_sweep_kills_only_the_servers_of_its_own_run(tmp_path):
    ray_tasks = pytest.importorskip("e2e.run.executors.ray_tasks")
    sweep = getattr(ray_tasks.sweep, "_function", ray_tasks.sweep)
    a, ab = str(tmp_path / "a"), str(tmp_path / "a::b")
    other = _victim({live_servers.SERVER_ENV: "s1", **live_servers.run_marks(ab, "c")})
    mine = _victim({live_servers.SERVER_ENV: "s2", **live_servers.run_marks(a, "b::c")})
    try:
        pid_other, pid_mine = _leader(other), _leader(mine)
        got = sweep(a)
        assert got["killed"] == [pid_mine] and got["left"] == []
        assert psutil.Process(pid_other).status() != psutil.STATUS_ZOMBIE
    finally:
        _stop(other, mine)
