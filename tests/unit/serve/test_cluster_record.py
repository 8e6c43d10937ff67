"""A Ray cluster's record names its processes by what no clock step moves (issue 35 item 2): start
ticks since boot, boot id and pid namespace (owners.process_identity), as live-server records do.

The processes are sleeps this test spawns and ends itself; nothing here signals anything (the
record is only read: what the sweep would stop is listed, never stopped). The records live in a
private temporary folder of the test's own, never the user's real <tmp>/e2e-ray-<uid>/.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile

import psutil
import pytest

from e2e.serve import cluster_record, owners


@pytest.fixture
def dead_owner(tmp_path, monkeypatch):
    """This process records as a harness that ran here and is gone; records go under tmp_path."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen(["sleep", "0"])
    gone.wait()
    ident = f"{socket.gethostname()}/{owners.boot_id()}/{owners.pid_namespace()}/{gone.pid}/1"
    owners.set_owner(ident)
    yield ident
    owners.set_owner(None)


@pytest.fixture
def sleeper():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield p
    p.kill()
    p.wait()


def _found(owner_id: str) -> list[int]:
    return [p.pid for _, who, procs in cluster_record.dead_owners_clusters() if who == owner_id for p in procs]


def _rewrite(owner_id: str, **change: object) -> None:
    path = cluster_record.cluster_record_path(owner_id)
    assert path is not None
    r = json.loads(path.read_text())
    r["procs"] = [{**e, **change} for e in r["procs"]]
    path.write_text(json.dumps(r))


def test_a_recorded_process_is_still_recognised_after_a_wall_clock_step(dead_owner, sleeper, monkeypatch):
    # was: recorded by psutil's create_time (boot time + ticks, read off the wall clock): the 18 s
    # step seen during the probe made the cluster's processes look gone, left running on its GPUs
    cluster_record.record_cluster([psutil.Process(sleeper.pid)])
    real = psutil.Process.create_time
    monkeypatch.setattr(psutil.Process, "create_time", lambda self: real(self) + 18.0)
    monkeypatch.setattr(psutil, "boot_time", lambda: 18.0)
    assert _found(dead_owner) == [sleeper.pid]


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"pid_ticks": -1}, id="same pid, another start: a reused pid"),
        pytest.param({"boot_id": "another-boot"}, id="another boot"),
        pytest.param({"pid_ns": 1}, id="another pid namespace"),
        pytest.param({"pid_ticks": None}, id="no start"),
    ],
)
def test_a_process_that_is_not_the_one_recorded_is_not_recognised(dead_owner, sleeper, change):
    cluster_record.record_cluster([psutil.Process(sleeper.pid)])
    assert _found(dead_owner) == [sleeper.pid]
    _rewrite(dead_owner, **change)
    assert _found(dead_owner) == []


def test_a_record_of_the_earlier_format_is_still_read(dead_owner, sleeper):
    path = cluster_record.cluster_record_path(dead_owner)
    assert path is not None
    started = psutil.Process(sleeper.pid).create_time()
    path.write_text(json.dumps({"owner": dead_owner, "pids": [[sleeper.pid, started], [sleeper.pid, started - 5]]}))
    assert _found(dead_owner) == [sleeper.pid]


@pytest.mark.parametrize(
    "record", [{"owner": 7, "procs": []}, {"procs": [1]}, {"procs": "x"}, {"pids": [[1]]}, {}, [1, 2]]
)
def test_a_damaged_record_is_skipped(dead_owner, record):
    path = cluster_record.cluster_record_path(dead_owner)
    assert path is not None
    path.write_text(json.dumps(record if isinstance(record, list) else {"owner": dead_owner, **record}))
    assert cluster_record.dead_owners_clusters() == []
