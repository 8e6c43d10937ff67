"""No hang, bounded memory for the tools the harness runs (issue 35 item 5): the manifest's
nvidia-smi reading (e2e/gpu/gpu_driver.py) runs through the one bounded runner
(e2e/safety/bounded_run.py) that the GPU probe uses too, so a tool that floods, hangs or prints
bytes that are not UTF-8 is one failed reading in bounded time and memory.

A STAND-IN nvidia-smi (a script on PATH): this machine has none, and a real one cannot be made to
flood, hang or print garbage on demand. Every stand-in is ended by the test (its pid is checked).
"""

from __future__ import annotations

import os
import sys
import time

import psutil
import pytest

from e2e.gpu import gpu_driver as manifest
from e2e.rundir import manifest as run_manifest
from e2e.safety.bounded_run import run_bounded, run_text
from tests.support import executable


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def smi(tmp_path, monkeypatch):
    """Puts a stand-in nvidia-smi running `body` first on PATH."""

    def put(body: str) -> None:
        executable(tmp_path / "nvidia-smi", f"#!/bin/sh\n{body}\n")
        monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")

    return put


def test_gpu_driver_reads_the_gpus_nvidia_smi_lists(smi):
    smi("echo 'NVIDIA H200, 570.86.15, 143771 MiB'; echo 'NVIDIA H200, 570.86.15, 143771 MiB'")
    assert manifest.gpu_driver() == {
        "nvidia_smi": [{"name": "NVIDIA H200", "driver": "570.86.15", "memory": "143771 MiB"}] * 2
    }


def test_no_nvidia_smi_is_no_reading_and_no_error(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert manifest.gpu_driver() == {}


@pytest.mark.parametrize(
    "body, deadline, why",
    [  # was: capture_output read a flood whole (unbounded), and a hang waited out 30 s, fixed
        ("head -c 3000000 /dev/zero | tr '\\0' 'x'; exec sleep 60", 5.0, f"printed more than {1 << 20} bytes"),
        ("exec sleep 60", 1.0, "did not answer within 1 s"),
    ],
)
def test_a_flooding_or_hanging_nvidia_smi_is_one_failed_reading_in_bounded_time(
    smi, tmp_path, monkeypatch, body, deadline, why
):
    monkeypatch.setattr(manifest, "SMI_DEADLINE_S", deadline, raising=False)
    pidfile = tmp_path / "smi.pid"
    smi(f"echo $$ > {pidfile}; {body}")
    t0 = time.monotonic()
    got = manifest.gpu_driver()
    assert time.monotonic() - t0 < 4
    assert got == {"nvidia_smi_error": why}
    assert _gone(int(pidfile.read_text()))


@pytest.mark.parametrize(
    "body, why",
    [
        (r"printf 'NVIDIA H200\377, 570.86.15, 143771 MiB\n'", "printed bytes that are not UTF-8 (b'\\xff')"),
        ("echo 'Failed to initialize NVML: Driver/library version mismatch' >&2; exit 18", "Failed to initialize NVML"),
        ("echo 'No devices were found'", "not the CSV asked for: 'No devices were found'"),
    ],
)
def test_what_is_not_its_csv_is_a_failed_reading_in_one_line(smi, body, why):
    # was: a UnicodeDecodeError traceback out of the manifest; the others an empty reading, silent
    smi(body)
    got = manifest.gpu_driver()
    assert list(got) == ["nvidia_smi_error"] and why in got["nvidia_smi_error"] and "\n" not in got["nvidia_smi_error"]


def test_the_runner_kills_the_whole_group_not_only_its_leader(tmp_path):
    pidfile = tmp_path / "child.pid"
    script = executable(tmp_path / "tool", f"#!/bin/sh\nsleep 60 &\necho $! > {pidfile}\nexec sleep 60\n")
    with pytest.raises(RuntimeError, match="did not answer within 0.5 s"):
        run_bounded([str(script)], 0.5, 1000)
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)  # SIGKILL is delivered at once; its parent (init) reaps it soon after
    assert _gone(child)


def test_run_text_returns_stdout_and_names_a_failed_exit(tmp_path):
    ok = executable(tmp_path / "ok", "#!/bin/sh\necho hello\n")
    assert run_text([str(ok)], 5.0, 1000) == "hello\n"
    bad = executable(tmp_path / "bad", "#!/bin/sh\nexit 3\n")
    with pytest.raises(RuntimeError, match="^exit 3$"):
        run_text([str(bad)], 5.0, 1000)


def test_an_arm_interpreter_that_floods_or_hangs_is_one_failed_probe_in_bounded_time(tmp_path, monkeypatch):
    """manifest.installation() (e2e/rundir/manifest.py) asks each arm's interpreter for its vLLM: a stand-in interpreter (a
    script, since no real Python floods on demand) that floods stdout, or hangs, is one error line,
    not unbounded memory or a wait of the whole probe timeout past a flood."""
    flood = executable(tmp_path / "flood-python", "#!/bin/sh\nexec yes 0123456789\n")
    monkeypatch.setattr(run_manifest, "PROBE_MAX_BYTES", 1 << 16)
    t0 = time.monotonic()
    got = run_manifest.installation(str(flood), timeout_s=20)
    assert got == {"error": f"printed more than {1 << 16} bytes", "executable": str(flood)}
    assert time.monotonic() - t0 < 10
    hang = executable(tmp_path / "hang-python", "#!/bin/sh\nsleep 60\n")
    got = run_manifest.installation(str(hang), timeout_s=1)
    assert got == {"error": "did not answer within 1 s", "executable": str(hang)}
    broken = executable(tmp_path / "broken-python", "#!/bin/sh\necho 'No module named vllm' >&2\nexit 1\n")
    assert run_manifest.installation(str(broken)) == {"error": "No module named vllm", "executable": str(broken)}
    ok = run_manifest.installation(sys.executable)
    assert ok.get("executable") == sys.executable and "error" not in ok
