"""Benchmark: the harness's own cost per timed request on loopback.

    python -m e2e.bench_overhead [--requests 200] [--depths 1024,8192,32768]

A STAND-IN server (a few lines of http.server in another process, answering instantly with a
canned completion and an empty /metrics) replaces vLLM here on purpose: with a server that does no
work, the client-timed region is the harness's own overhead (HTTP on loopback, response parsing).
Prints the median and p99 per depth. Target: under 1 ms per request.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from e2e.measure import CellClient
from e2e.server import free_port


class _Instant(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    served = 0  # requests answered, reported as a histogram count like vLLM's
    busy_s = 0.0  # the stand-in's own handling time, reported as the e2e histogram's sum

    def log_message(self, *a):  # quiet
        pass

    def _send(self, body: bytes, ctype: str) -> None:
        # Headers and body in ONE write: split writes meet Nagle + delayed ACK (~40 ms stalls).
        head = (f"HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        self.wfile.write(head + body)

    def do_GET(self):
        n = _Instant.served
        text = (f"# TYPE vllm:e2e_request_latency_seconds histogram\n"
                f"vllm:e2e_request_latency_seconds_sum {_Instant.busy_s!r}\n"
                f"vllm:e2e_request_latency_seconds_count {n}\n")
        self._send(text.encode(), "text/plain")

    def do_POST(self):
        raw = self.rfile.read(int(self.headers["Content-Length"]))
        t0 = time.perf_counter()  # like vLLM's own clock: from a received request to its answer
        req = json.loads(raw)
        n = req["max_tokens"]
        body = json.dumps({"choices": [{"text": "x" * n, "finish_reason": "length"}],
                           "usage": {"prompt_tokens": len(req["prompt"]), "completion_tokens": n}})
        _Instant.served += 1
        _Instant.busy_s += time.perf_counter() - t0
        self._send(body.encode(), "application/json")


def _serve(port: int) -> None:
    ThreadingHTTPServer(("127.0.0.1", port), _Instant).serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=200)
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
    print("depth  client_ms  stand-in_ms  overhead_ms (median)  overhead_p99_ms")
    try:
        for d in [int(x) for x in a.depths.split(",")]:
            prompt = list(range(d))
            rows = [client.complete(prompt, 64) for _ in range(a.requests)]
            tc = [r["t_client_s"] for r in rows]
            ts = [r["server_e2e_s"] for r in rows]
            # The same figure a real cell reports: client time minus the server's own time.
            ov = sorted(c - s for c, s in zip(tc, ts))
            print(f"{d:6d}  {statistics.median(tc) * 1e3:9.3f}  {statistics.median(ts) * 1e3:11.3f}"
                  f"  {statistics.median(ov) * 1e3:20.3f}  {ov[int(0.99 * (len(ov) - 1))] * 1e3:15.3f}")
    finally:
        client.close()
        proc.terminate()


if __name__ == "__main__":
    main()
