"""A command run within one deadline and an output limit, whatever it does: it floods or hangs,
the caller gets one failed reading (RuntimeError, one line) in bounded time and memory. Output that
is not UTF-8, and a non-zero exit, are such a reading too (run_text), never a traceback.

The command runs in a session of its own; past either bound its whole process group is killed
(SIGKILL: its output is abandoned, nothing is left to flush) and its leader reaped. The tools run
this way (nvidia-smi for a GPU reading and for the manifest) answer in milliseconds with a few KB.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time

__all__ = ["run_bounded", "run_text"]

_REAP_S = 10.0  # a killed process in uninterruptible sleep is given this long to be reaped


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the leader's pid is the group id
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(_REAP_S)
    except subprocess.TimeoutExpired:
        pass


def run_bounded(argv: list[str], timeout: float, limit: int) -> tuple[int, bytes, bytes]:
    """argv's exit status, stdout and stderr, each read to at most `limit` bytes within `timeout` s.
    Past either, its process group is killed and RuntimeError says which; OSError when argv cannot
    be started."""
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    assert proc.stdout is not None and proc.stderr is not None
    fds = (proc.stdout.fileno(), proc.stderr.fileno())
    got = {fd: bytearray() for fd in fds}
    deadline = time.monotonic() + timeout
    try:
        with selectors.DefaultSelector() as sel:
            for fd in got:
                sel.register(fd, selectors.EVENT_READ)
            while sel.get_map():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"did not answer within {timeout:g} s")
                for key, _ in sel.select(left):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fileobj)
                    elif len(got[key.fd]) + len(chunk) > limit:
                        raise RuntimeError(f"printed more than {limit} bytes")
                    else:
                        got[key.fd] += chunk
        code = proc.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise RuntimeError(f"did not exit within {timeout:g} s") from None
    except BaseException:
        _kill_group(proc)
        raise
    finally:
        proc.stdout.close()
        proc.stderr.close()
    return code, bytes(got[fds[0]]), bytes(got[fds[1]])


def run_text(argv: list[str], timeout: float, limit: int) -> str:
    """run_bounded()'s stdout, decoded. RuntimeError, one line, for bytes that are not UTF-8 and for a
    non-zero exit (its last line of stderr, else of stdout)."""
    code, out, err = run_bounded(argv, timeout, limit)
    try:
        stdout, stderr = out.decode(), err.decode()
    except UnicodeDecodeError as exc:
        raise RuntimeError(f"printed bytes that are not UTF-8 ({exc.object[exc.start : exc.start + 1]!r})") from None
    if code != 0:
        lines = (stderr or stdout).strip().splitlines()
        raise RuntimeError(lines[-1][:200] if lines else f"exit {code}")
    return stdout
