"""Benchmark: the harness's own cost per timed request on loopback.

    python -m e2e.run.bench_overhead [--requests 200] [--depths 1024,8192,32768]

A STAND-IN server (a few lines of http.server in another process, answering instantly with a
canned completion and a /metrics e2e histogram of its own handling time) replaces vLLM here on
purpose: with a server that does no work, what remains is HTTP on loopback and the two ends' Python.

Columns, medians per depth:
  client_ms     the harness's timed region (CellClient.complete), as in a real cell
  stand-in_ms   the stand-in's own handling time (what a real server reports as its e2e time)
  overhead_ms   client - stand-in: what a real cell reports as client_overhead_ms_median
  floor_ms      the same difference for a minimal raw-socket client against the same stand-in:
                loopback plus the stand-in's HTTP parsing, which no client can avoid
  harness_ms    overhead - floor: the harness's own share. Target: under 1 ms per request.
Both clients send a freshly encoded body per request (no prefix reuse, as in a real cell) and alternate
in rounds of 20 so that drift hits both alike. This machine's noise moves the figures by ~0.3 ms.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import socket
import statistics
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from e2e.run import metrics
from e2e.run.measure import CellClient
from e2e.serve.server import free_port


class _Instant(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    served = 0  # requests answered, reported as a histogram count like vLLM's
    busy_s = 0.0  # the stand-in's own handling time, reported as the e2e histogram's sum

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _send(self, body: bytes, ctype: str) -> None:
        # Headers and body in ONE write: split writes meet Nagle + delayed ACK (~40 ms stalls).
        head = (f"HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        self.wfile.write(head + body)

    def do_GET(self) -> None:
        n = _Instant.served
        text = (
            f"# TYPE vllm:e2e_request_latency_seconds histogram\n"
            f"vllm:e2e_request_latency_seconds_sum {_Instant.busy_s!r}\n"
            f"vllm:e2e_request_latency_seconds_count {n}\n"
        )
        self._send(text.encode(), "text/plain")

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        t0 = time.perf_counter()  # like vLLM's own clock: from a received request to its answer
        req = json.loads(raw)
        n = req["max_tokens"]
        body = json.dumps(
            {
                "choices": [{"text": "x" * n, "finish_reason": "length"}],
                "usage": {"prompt_tokens": len(req["prompt"]), "completion_tokens": n},
            }
        )
        _Instant.served += 1
        _Instant.busy_s += time.perf_counter() - t0
        self._send(body.encode(), "application/json")


def _serve(port: int) -> None:
    ThreadingHTTPServer(("127.0.0.1", port), _Instant).serve_forever()


class _RawClient:
    """The floor reference: one keep-alive socket, one write per request, no HTTP library."""

    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def post(self, body: bytes) -> float:
        req = (
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        ) + body
        t0 = time.perf_counter()
        self.sock.sendall(req)
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += self.sock.recv(65536)
        head, _, rest = buf.partition(b"\r\n\r\n")
        n = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
        while len(rest) < n:
            rest += self.sock.recv(65536)
        return time.perf_counter() - t0

    def close(self) -> None:
        self.sock.close()


def _ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=200, help="per depth and client")
    ap.add_argument("--depths", default="1024,8192,32768")
    a = ap.parse_args()
    port = free_port()
    proc = mp.get_context("spawn").Process(target=_serve, args=(port,), daemon=True)
    proc.start()
    import httpx

    for _ in range(100):
        try:
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.2)
            break
        except httpx.HTTPError:
            time.sleep(0.05)
    client = CellClient(f"http://127.0.0.1:{port}", "k", 10.0)
    raw = _RawClient(port)
    print("depth  client_ms  stand-in_ms  overhead_ms  floor_ms  harness_ms  overhead_p99_ms")
    try:
        for d in [int(x) for x in a.depths.split(",")]:
            prompt = list(range(d))
            tc: list[float] = []
            ts: list[float] = []
            floor: list[float] = []
            while len(tc) < a.requests:
                for _ in range(20):
                    row = client.complete(prompt, 64)
                    tc.append(row["t_client_s"])
                    ts.append(row["server_e2e_s"])
                for _ in range(20):
                    body = json.dumps(
                        {"model": "m", "prompt": prompt, "max_tokens": 64}, separators=(",", ":")
                    ).encode()
                    before = metrics.scrape(client.http)
                    t = raw.post(body)
                    after = metrics.scrape_after(client.http, before)
                    server_s = metrics.deltas(before, after)["server_e2e_s"]
                    assert server_s is not None, "the stand-in counts every request it answers"
                    floor.append(t - server_s)
                client.resync()
            ov = sorted(c - s for c, s in zip(tc, ts))
            print(
                f"{d:5d}  {_ms(tc):9.3f}  {_ms(ts):11.3f}  {_ms(ov):11.3f}  {_ms(floor):8.3f}"
                f"  {_ms(ov) - _ms(floor):10.3f}"
                f"  {ov[int(0.99 * (len(ov) - 1))] * 1e3:15.3f}"
            )
    finally:
        raw.close()
        client.close()
        proc.terminate()


if __name__ == "__main__":
    main()
