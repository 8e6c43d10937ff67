"""The bandwidth probe's child process and JSON plumbing, for real on the CPU (device="cpu"); the
failure paths with stand-in interpreters. The GPU figure itself is only proven on a GPU (the gpu test)."""

from __future__ import annotations

import json
import stat
import sys

import pytest

from e2e.gpu import bandwidth


def _fake_python(tmp_path, body: str) -> str:
    f = tmp_path / "python"
    f.write_text("#!/bin/sh\n" + body + "\n")
    f.chmod(f.stat().st_mode | stat.S_IXUSR)
    return str(f)


def test_cpu_run_of_the_real_child_script():
    import torch

    r = bandwidth.measure(sys.executable, "cpu", max_bytes=32 << 20, warmup=1, iters=5, timeout_s=120)
    assert r["available"] is True, r
    assert r["device"] == "cpu" and r["torch_version"] == torch.__version__
    assert r["bytes"] == 32 << 20 and r["iterations"] == 5 and len(r["times_ms"]) == 5
    # the figures are bytes over the timed sums (times_ms rounded to 0.1 us)
    assert r["best_gbps"] == pytest.approx(r["bytes"] / min(r["times_ms"]) / 1e6, rel=1e-3)
    assert r["best_gbps"] >= r["median_gbps"] > 0
    assert "torch.sum" in r["method"]
    assert bandwidth.measured_gbps(r) == r["best_gbps"]


def test_no_cuda_is_a_reason_not_an_exception():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    r = bandwidth.measure(sys.executable, "cuda", timeout_s=120)
    assert r == {"available": False, "reason": r["reason"]} and "no CUDA" in r["reason"]
    assert bandwidth.measured_gbps(r) is None


def test_missing_interpreter_crash_timeout_and_garbage(tmp_path):
    r = bandwidth.measure(str(tmp_path / "absent-python"))
    assert not r["available"] and "cannot run" in r["reason"]
    crash = _fake_python(tmp_path, "echo 'Traceback ...' >&2; echo 'RuntimeError: CUDA out of memory' >&2; exit 3")
    r = bandwidth.measure(crash)
    assert r == {"available": False, "reason": "bandwidth probe exited 3: RuntimeError: CUDA out of memory"}
    slow = _fake_python(tmp_path, "exec sleep 30")
    r = bandwidth.measure(slow, timeout_s=0.5)
    assert not r["available"] and "timed out after 0.5 s" in r["reason"]
    garbage = _fake_python(tmp_path, "echo hello")
    r = bandwidth.measure(garbage)
    assert not r["available"] and "no JSON" in r["reason"]
    wrong = _fake_python(tmp_path, "echo '[1, 2]'")
    assert "unexpected" in bandwidth.measure(wrong)["reason"]


def test_measured_gbps_rejects_what_no_floor_can_use():
    for bad in (
        None,
        {},
        {"available": False},
        {"available": True, "best_gbps": 0},
        {"available": True, "best_gbps": float("nan")},
        {"available": True, "best_gbps": "4000"},
    ):
        assert bandwidth.measured_gbps(bad) is None, bad
    assert bandwidth.measured_gbps({"available": True, "best_gbps": 4321}) == 4321.0


@pytest.mark.gpu
def test_gpu_read_bandwidth_is_below_the_datasheet_and_near_it():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from e2e.gpu import roofline

    r = bandwidth.measure(sys.executable)
    assert r["available"], r
    peak, _ = roofline.bandwidth_for(r["device_name"])
    # a streaming read reaches well over half of the datasheet peak and never exceeds it
    assert 0.5 * peak < r["best_gbps"] <= peak, r


def test_a_bare_cuda_device_is_given_its_index(monkeypatch):
    """torch.cuda.mem_get_info(torch.device("cuda")) raises ("Expected a torch.device with a
    specified index"): on the H200 the probe failed so. The child must get cuda:0."""
    import subprocess

    from e2e.gpu import bandwidth

    seen = {}

    def fake_run(argv, **kw):
        seen["args"] = json.loads(argv[-1])
        return subprocess.CompletedProcess(argv, 0, stdout=json.dumps({"available": False, "reason": "x"}), stderr="")

    monkeypatch.setattr(bandwidth.subprocess, "run", fake_run)
    bandwidth.measure("python3", "cuda")
    assert seen["args"]["device"] == "cuda:0"
    assert 'torch.device("cuda", 0)' in bandwidth.CHILD  # and the child does the same for its own caller
