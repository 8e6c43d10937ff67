"""--executor ray with the cluster the run starts itself (issue 22): it listens on loopback only and
refuses a client without its token; SIGTERM to the driver is the same clean interrupt as Ctrl-C;
SIGKILL of the driver leaves nothing that the next --resume does not stop. Against the STAND-IN of
tests/support/orphans.py (a Ray cluster start is ~20 s here; the rest seconds)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from e2e.serve import live_servers
from tests.support.orphans import (
    HF_TOKEN,
    kill_all,
    manifest,
    orphan_cfg,
    secrets_in,
    start_harness,
    start_run,
    tagged_processes,
    the_server,
    wait_for_line,
)

pytest.importorskip("ray")

# One RPC to the GCS, as a client outside the cluster would make it (Ray's own GcsClient).
PROBE = """
import sys
from ray._raylet import GcsClient
try:
    GcsClient(address=sys.argv[1]).internal_kv_get(b"probe", None, timeout=10)
    print("ANSWERED")
except Exception as exc:
    print("REFUSED", type(exc).__name__, str(exc).splitlines()[0])
"""


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    from tests.support.orphans import write_standin

    return write_standin(tmp_path_factory.mktemp("orphan-standin"))


def owned_by(driver: str) -> list[psutil.Process]:
    """Live processes of the driver's Ray cluster or servers (by the owner in their environment)."""
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            env = p.environ()
            if (
                driver in (env.get(live_servers.CLUSTER_ENV), env.get(live_servers.HARNESS_ENV))
                and p.status() != psutil.STATUS_ZOMBIE
            ):
                out.append(p)
        except psutil.Error:
            continue
    return out


def gone(driver: str, timeout: float = 30) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while (left := owned_by(driver)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def probe(gcs: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    r = subprocess.run(
        [sys.executable, "-c", PROBE, gcs], env={**clean, **env}, capture_output=True, text=True, timeout=120
    )
    return next((x for x in r.stdout.splitlines() if x.startswith(("ANSWERED", "REFUSED"))), r.stdout + r.stderr)


def test_its_own_cluster_is_loopback_only_and_token_authenticated_and_sigterm_is_a_clean_interrupt(tmp_path, standin):
    home = tmp_path / "home"  # where Ray's default would write its token (~/.ray/auth_token)
    home.mkdir()
    cfg = orphan_cfg(tmp_path / "c.toml", standin)
    run = tmp_path / "r"
    p, seen = start_run(cfg, tmp_path, "r", "--executor", "ray", env={"HOME": str(home)})
    driver = None
    try:
        wait_for_line(p, "measuring", seen, timeout=240)
        driver = live_servers.identity(p.pid)
        cluster = [x for x in psutil.Process(p.pid).children(recursive=True) if "--port" not in x.cmdline()]
        listening = {
            (x.name(), c.laddr.ip, c.laddr.port)
            for x in [psutil.Process(p.pid), *cluster]
            for c in x.net_connections("inet")
            if c.status == psutil.CONN_LISTEN
        }
        assert listening and all(ip in ("127.0.0.1", "::ffff:127.0.0.1") for _, ip, _ in listening), listening
        assert manifest(run)["executors"][-1]["security"] == {"auth": "token", "listening": "127.0.0.1 only"}
        # GCS, raylet, workers, agents: every one carries its owner (what finds them if the driver dies)
        # Every process of the cluster can be found once the driver is gone: by the owner in its
        # environment, or (Ray's agents overwrite theirs with their title) by the cluster's record.
        record = live_servers.cluster_record_path(driver)
        recorded = {e["pid"] for e in json.loads(record.read_text())["procs"]}
        owned = {x.pid for x in owned_by(driver)} | recorded
        unfound = [x for x in cluster if x.pid not in owned and x.is_running()]
        assert not unfound, [(x.pid, x.name(), x.cmdline()[:3]) for x in unfound]
        [gcs] = [x for x in cluster if x.name() == "gcs_server"]
        port = min(c.laddr.port for c in gcs.net_connections("inet") if c.status == psutil.CONN_LISTEN)
        token = gcs.environ()["RAY_AUTH_TOKEN"]  # made for this run: in the cluster's environment only
        address = f"127.0.0.1:{port}"
        assert probe(address).startswith("REFUSED AuthenticationError"), probe(address)
        assert probe(address, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="0" * 64).startswith("REFUSED Authentication")
        assert probe(address, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token) == "ANSWERED"  # the probe works
        assert not (home / ".ray").exists()  # the token was never written to a file
        server = the_server(run)
        p.send_signal(signal.SIGTERM)
        out = p.communicate(timeout=180)[0]
        assert p.returncode == 130 and "Traceback" not in out, "".join(seen) + out
        assert manifest(run)["status"] == "interrupted"
        assert not psutil.pid_exists(server.pid) or server.status() == psutil.STATUS_ZOMBIE
        assert not tagged_processes(run) and not gone(driver)  # the servers and the whole cluster
        assert not [x for x in cluster if x.is_running() and x.status() != psutil.STATUS_ZOMBIE]
        assert not record.exists()  # a cluster stopped by its own harness leaves no record
        assert not secrets_in(run, [token, HF_TOKEN])
    finally:
        p.kill()
        if driver:
            kill_all(owned_by(driver))
        kill_all(tagged_processes(run))


def test_a_sigkilled_driver_leaves_nothing_the_next_resume_does_not_stop(tmp_path, standin):
    cfg = orphan_cfg(tmp_path / "c.toml", standin)
    run = tmp_path / "k"
    p, seen = start_run(cfg, tmp_path, "k", "--executor", "ray")
    driver = q = None
    try:
        wait_for_line(p, "measuring", seen, timeout=240)
        driver = live_servers.identity(p.pid)
        env = the_server(run).environ()
        everything = psutil.Process(p.pid).children(recursive=True)  # the cluster, its agents, the server
        p.kill()
        p.wait()
        time.sleep(2)
        assert tagged_processes(run), "the server died with the driver: nothing to test"
        q, seen = start_harness("--resume", run)  # the local executor: no Ray needed to clean up
        wait_for_line(q, "measuring", seen)
        assert not [x for x in tagged_processes(run) if x.environ()["E2E_SERVER_ID"] == env["E2E_SERVER_ID"]]
        assert "stopped what a harness that died left running: 1 server(s)" in "".join(seen), "".join(seen)
        assert env.get(live_servers.HARNESS_ENV) == driver  # a task's server is owned by the driver
        assert not gone(driver)  # nor is anything left of its cluster that Ray's reaper missed
        assert not [x for x in everything if x.is_running() and x.status() != psutil.STATUS_ZOMBIE]
        assert not live_servers.cluster_record_path(driver).exists()
        m = manifest(run)
        assert m["resumes"][-1]["status_before"] == "harness-died"
        assert [e["server_id"] for e in m["orphans_stopped"] if e["kind"] == "server"] == [env["E2E_SERVER_ID"]]
        q.send_signal(signal.SIGINT)
        q.communicate(timeout=60)
        assert q.returncode == 130 and not tagged_processes(run)
        assert not secrets_in(run, [env["VLLM_API_KEY"], HF_TOKEN])
    finally:
        for x in (p, q):
            if x:
                x.kill()
        if driver:
            kill_all(owned_by(driver))
        kill_all(tagged_processes(run))
