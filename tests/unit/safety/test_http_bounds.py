"""No hang, bounded memory (issue 35 items 10, 11): an answer is read within one deadline for the
whole exchange and up to a size limit (e2e/safety/http_read.py), for a completion (batch 1 and c),
a /metrics scrape, the /health check after a failed request and the readiness wait.

Against a STAND-IN (http.server in a thread): a real server cannot be made to trickle its answer a
byte at a time, announce 2 GB or flood /metrics on demand. Each trickle stops after TRICKLE_S, so
that code without a whole-exchange deadline fails the time bound instead of hanging the suite.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from e2e.run import measure, metrics
from e2e.run.batch import BatchClient
from e2e.run.measure import CellClient
from e2e.safety import http_read
from e2e.serve.server import ServerFailure, ServerGone, ServerSpec, VllmServer

TRICKLE_S = 6.0
METRICS = b"vllm:e2e_request_latency_seconds_sum 0.0\nvllm:e2e_request_latency_seconds_count 0\n"
ANSWER = json.dumps(
    {"choices": [{"finish_reason": "length"}], "usage": {"prompt_tokens": 16, "completion_tokens": 8}}
).encode()


class Hostile(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    post = "ok"  # what a completion gets
    get = "ok"  # what /metrics and /health get

    def log_message(self, *a):
        pass

    def _trickle(self, data: bytes) -> None:
        end = time.monotonic() + TRICKLE_S
        for i in range(len(data)):
            self.wfile.write(data[i : i + 1])
            self.wfile.flush()
            if time.monotonic() < end:
                time.sleep(0.2)

    def _answer(self, mode: str, body: bytes) -> None:
        head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        try:
            if mode == "ok":
                self.wfile.write(head + body)
            elif mode == "trickle":
                self.wfile.write(head)
                self._trickle(body)
            elif mode == "trickle-head":
                self._trickle(head + body)
            elif mode == "announce-2gb":  # says 2 GB, sends 1 MB, then stalls
                self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2000000000\r\n\r\n" + b"x" * (1 << 20))
                time.sleep(3)
            elif mode == "flood":  # chunked, no length: 40 MB of a valid body
                self.wfile.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                chunk = b"# filler line of a long /metrics page\n" * 1700
                for _ in range((40 << 20) // len(chunk)):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
            self.close_connection = mode != "ok"
        except OSError:  # the client gave up: what is being tested
            self.close_connection = True

    def do_GET(self):
        body = METRICS if self.path.endswith("/metrics") else b'{"data": [{"id": "bench-model"}]}'
        self._answer(Hostile.get, body)

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self._answer(Hostile.post, ANSWER)


@pytest.fixture
def hostile():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()
    srv.server_close()
    Hostile.post = Hostile.get = "ok"


def _timed(fn):
    t0 = time.monotonic()
    out = fn()
    return out, time.monotonic() - t0


@pytest.mark.parametrize("mode", ["trickle", "trickle-head"])
def test_a_trickled_completion_is_cut_at_the_request_timeout_in_all(hostile, mode):
    # was: the timeout bounded each read only; a byte every 0.2 s kept the request alive
    Hostile.post = mode
    client = CellClient(hostile, "k", request_timeout_s=1.0)
    row, took = _timed(lambda: client.complete(list(range(16)), 8))
    assert row["error"] == "request timed out" and took < 2.5
    Hostile.post = "ok"
    assert client.complete(list(range(16)), 8).get("error") is None  # the next request on a new connection
    client.close()


@pytest.mark.parametrize("mode, why", [("announce-2gb", "2000000000 bytes"), ("flood", "over the limit")])
def test_a_huge_completion_body_is_one_failed_request_never_read_whole(hostile, mode, why):
    # was: the body was read whole, whatever its size: 2 GB stopped the run with a MemoryError
    Hostile.post = mode
    client = CellClient(hostile, "k", request_timeout_s=5.0)
    row, took = _timed(lambda: client.complete(list(range(16)), 8))
    assert row["error"].startswith("response: ") and why in row["error"] and took < 4
    client.close()


def test_a_round_of_c_requests_has_the_same_bounds(hostile):
    Hostile.post = "trickle"
    client = BatchClient(hostile, "k", 1.0, 2)
    out, took = _timed(lambda: client.send([list(range(16))] * 2, 8))
    assert [o["error"] for o in out] == ["request timed out"] * 2 and took < 2.5
    Hostile.post = "announce-2gb"
    assert all("over the limit" in o["error"] for o in client.send([list(range(16))] * 2, 8))
    client.close()


@pytest.mark.parametrize("mode, why", [("flood", "over the limit"), ("trickle", "within 1 s")])
def test_a_flooding_or_trickling_metrics_voids_the_attempt_in_bounded_time(hostile, mode, why):
    # was: /metrics was read whole (100 MB seen), and per read
    Hostile.get = mode
    client = CellClient(hostile, "k", request_timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(ServerGone, match=why):
        client.complete(list(range(16)), 8)
    assert time.monotonic() - t0 < 2.5
    client.close()
    with httpx.Client(base_url=hostile, timeout=1.0) as c:
        with pytest.raises(httpx.HTTPError, match=why):
            metrics.scrape(c)


def test_metrics_are_read_on_one_kept_connection_per_client(hostile):
    with httpx.Client(base_url=hostile, timeout=1.0) as c:
        assert metrics.scrape_text(c) == METRICS.decode()
        first = metrics._conns[c].sock
        metrics.scrape(c)
        assert metrics._conns[c].sock is first


def test_a_trickled_health_answer_cannot_outlive_the_startup_timeout(hostile, tmp_path):
    # was: each /health poll had a 2 s read timeout: a byte a second never ended the start
    Hostile.get = "trickle"
    port = int(hostile.rsplit(":", 1)[1])
    srv = VllmServer(ServerSpec("python", "m"), tmp_path / "s.log", startup_timeout_s=1.5, port=port)
    srv.proc = subprocess.Popen(["sleep", "30"])
    srv._t0 = time.monotonic()
    try:
        with pytest.raises(ServerFailure, match="not ready after 2 s"):
            srv.wait_ready()
        assert time.monotonic() - srv._t0 < 4.5
    finally:
        srv.proc.kill()
        srv.proc.wait()


@pytest.mark.parametrize("mode", ["trickle", "trickle-head", "announce-2gb"])
def test_a_trickled_or_huge_health_answer_is_unhealthy_within_its_deadline(hostile, monkeypatch, mode):
    # was: httpx's timeout bounded each read only: a byte every 0.2 s read as healthy, after 6 s
    monkeypatch.setattr(measure, "HEALTH_TIMEOUT_S", 1.0, raising=False)
    Hostile.get = mode
    client = CellClient(hostile, "k", request_timeout_s=1.0)
    healthy, took = _timed(client.healthy)
    assert healthy is False and took < 2.5
    Hostile.get = "ok"
    assert client.healthy() is True
    client.close()


def test_exchange_limits_and_deadline_directly(hostile):
    Hostile.get = "announce-2gb"
    with pytest.raises(http_read.TooLarge, match="2000000000 bytes, over the limit of 1000"):
        http_read.get(hostile, "/x", {}, 2.0, 1000)
    Hostile.get = "trickle"
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="no whole answer within 0.5 s"):
        http_read.get(hostile, "/x", {}, 0.5, 1000)
    assert time.monotonic() - t0 < 1.5
    Hostile.get = "ok"
    assert http_read.get(hostile, "/x", {}, 2.0, 1000) == (200, b'{"data": [{"id": "bench-model"}]}')


def test_a_driver_that_wedges_at_shutdown_costs_one_deadline(monkeypatch):
    # was: GpuProbe.close called nvmlShutdown with no deadline: a wedged driver hung the run's end
    from e2e.gpu import gpu_probe

    release = threading.Event()

    class Stuck:
        source = "nvml"

        def close(self):
            release.wait(10)  # bounded: the test ends either way

    monkeypatch.setattr(gpu_probe, "DEADLINE_S", 0.5)
    probe = gpu_probe.GpuProbe(["0"], Stuck(), None)
    t0 = time.monotonic()
    try:
        probe.close()
        assert time.monotonic() - t0 < 2
        assert probe.sample("after")["reason"].startswith("nvml: nvml shutdown did not answer within 0.5 s")
    finally:
        release.set()
