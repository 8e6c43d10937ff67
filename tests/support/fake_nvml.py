"""A STAND-IN for pynvml (nvidia-ml-py) that scripts what a GPU shows over time: its processes,
clocks, power, temperature, clock-event (throttle) reasons and violation counters.

Why a fake: the faults under test (another process on a cell's GPU, a throttled GPU) cannot be
produced on this CPU-only machine, which has no GPU and no NVML. Everything around it is the
harness's own code; the real pynvml's "no GPU" path is tested as it is (tests/unit/gpu/test_gpu_state.py).

Time is counted in samples: one tick per reading of the first GPU's process list (gpu_state reads
every GPU once per sample, in order), from 0 at each nvmlInit (each server group opens its own
probe). gpu_state's schedule names the ticks: pre-start, ready, warm, round R..., bookend R...

Script, as configure(dict) in-process or a JSON file named by E2E_FAKE_NVML_SCRIPT:
    gpus          how many GPUs (default 1)
    (always)      every GPU lists this process's children that carry E2E_SERVER_ID: the servers this
                  harness (or Ray task) started, as NVML lists a server's processes on its GPUs
    init_error    nvmlInit raises NVMLError with this text
    unsupported   names of functions that raise NVMLError ("Not Supported")
    events        [{"from": t0, "to": t1 (exclusive; default forever), "probe": k (the k-th
                  nvmlInit that reads, from 1; default every one), "gpu": i (default 0), and any of
                  "foreign": [{"pid", "used_mib"}], "reasons": bitmask, "power_violation_ms": per tick,
                  "sm_mhz", "mem_mhz", "power_w", "temp_c"}]
"""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace
from typing import Any

import psutil

NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2
NVML_TEMPERATURE_GPU = 0
NVML_PERF_POLICY_POWER, NVML_PERF_POLICY_THERMAL = 0, 1
BASE = {"sm_mhz": 1980, "mem_mhz": 3201, "power_w": 480.0, "temp_c": 45, "reasons": 0}


class NVMLError(Exception):
    pass


_state: dict[str, Any] = {"script": None, "inits": 0, "tick": -1, "t": 0.0, "violation_ns": {}, "energy_mj": {}}


def configure(script: dict[str, Any] | None) -> None:
    _state.update(script=script, inits=0, tick=-1, violation_ns={}, energy_mj={})


def _script() -> dict[str, Any]:
    if _state["script"] is None and os.environ.get("E2E_FAKE_NVML_SCRIPT"):
        with open(os.environ["E2E_FAKE_NVML_SCRIPT"]) as f:
            _state["script"] = json.load(f)
    return _state["script"] or {}


def _check(name: str) -> None:
    if name in _script().get("unsupported", []):
        raise NVMLError("Not Supported")


def _events(gpu: int) -> list[dict[str, Any]]:
    t, k = _state["tick"], _state["inits"]
    return [
        e
        for e in _script().get("events", [])
        if e.get("gpu", 0) == gpu and e.get("probe", k) == k and e.get("from", 0) <= t < e.get("to", 10**9)
    ]


def _value(gpu: int, key: str) -> Any:
    v = BASE[key]
    for e in _events(gpu):
        v = e.get(key, v)
    return v


def nvmlInit() -> None:
    s = _script()
    if s.get("init_error"):
        raise NVMLError(s["init_error"])
    # a probe counts from its first reading: the run's start check (e2e/run/preflight.py) opens one
    # that never reads, and the script's probe numbers stay the server groups'
    _state.update(fresh=True, tick=-1, t=time.time(), violation_ns={}, energy_mj={})


def nvmlShutdown() -> None:
    pass


def nvmlDeviceGetCount() -> int:
    return int(_script().get("gpus", 1))


def nvmlDeviceGetHandleByIndex(i: int) -> int:
    if not 0 <= i < nvmlDeviceGetCount():
        raise NVMLError("Invalid Argument")
    return i


def nvmlDeviceGetHandleByUUID(uuid: str) -> int:
    for i in range(nvmlDeviceGetCount()):
        if nvmlDeviceGetUUID(i) == uuid:
            return i
    raise NVMLError("Not Found")


def nvmlDeviceGetIndex(h: int) -> int:
    return h


def nvmlDeviceGetUUID(h: int) -> str:
    return f"GPU-fake-{h}"


def nvmlDeviceGetName(h: int) -> str:
    return "Fake H200"


def _own_pids() -> list[int]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "E2E_SERVER_ID" in p.environ():
                out.append(p.pid)
        except (psutil.Error, OSError):
            continue
    return out


def nvmlDeviceGetComputeRunningProcesses(h: int) -> list[Any]:
    if h == 0:
        if _state.pop("fresh", False):
            _state["inits"] += 1
        _state["tick"] += 1
        now, dt = time.time(), time.time() - _state["t"]
        _state["t"] = now
        for g in range(nvmlDeviceGetCount()):  # the cumulative counters run on with the clock
            ms = sum(e.get("power_violation_ms", 0) for e in _events(g))
            _state["violation_ns"][g] = _state["violation_ns"].get(g, 0) + int(ms * 1e6)
            _state["energy_mj"][g] = _state["energy_mj"].get(g, 0) + dt * _value(g, "power_w") * 1000
    _check("nvmlDeviceGetComputeRunningProcesses")  # after the tick: time runs on when it fails
    procs = [SimpleNamespace(pid=pid, usedGpuMemory=1 << 30) for pid in _own_pids()]
    for e in _events(h):
        procs += [
            SimpleNamespace(pid=f["pid"], usedGpuMemory=int(f.get("used_mib", 1024) * 2**20))
            for f in e.get("foreign", [])
        ]
    return procs


def nvmlDeviceGetClockInfo(h: int, kind: int) -> int:
    _check("nvmlDeviceGetClockInfo")
    return _value(h, "sm_mhz" if kind == NVML_CLOCK_SM else "mem_mhz")


def nvmlDeviceGetPowerUsage(h: int) -> int:
    _check("nvmlDeviceGetPowerUsage")
    return int(_value(h, "power_w") * 1000)


def nvmlDeviceGetTemperature(h: int, kind: int) -> int:
    _check("nvmlDeviceGetTemperature")
    return _value(h, "temp_c")


def nvmlDeviceGetCurrentClocksEventReasons(h: int) -> int:
    _check("nvmlDeviceGetCurrentClocksEventReasons")
    return _value(h, "reasons")


nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons


def nvmlDeviceGetTotalEnergyConsumption(h: int) -> int:
    _check("nvmlDeviceGetTotalEnergyConsumption")
    return int(_state["energy_mj"].get(h, 0))  # mJ, drawn at the scripted power since the last tick


def nvmlDeviceGetViolationStatus(h: int, policy: int) -> Any:
    _check("nvmlDeviceGetViolationStatus")
    ns = _state["violation_ns"].get(h, 0) if policy == NVML_PERF_POLICY_POWER else 0
    return SimpleNamespace(referenceTime=int(time.time() * 1e6), violationTime=ns)
