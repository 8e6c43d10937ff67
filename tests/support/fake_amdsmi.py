"""A STAND-IN for the `amdsmi` package (PyPI amdsmi, ROCm's AMD SMI Python interface) that scripts what
an AMD GPU shows over time: its processes, clocks, power, temperature, energy counter, throttle status
and (MI300 and newer) violation counters.

Why a fake: this CPU-only machine has no AMD GPU and no libamd_smi.so, and no project machine has an
AMD GPU. The names, arguments, return dicts and exceptions are copied from amdsmi 7.0.2's
amdsmi_interface.py / amdsmi_exception.py (read from the wheel, not guessed):
    amdsmi_init(flag) / amdsmi_shut_down()
    amdsmi_get_processor_handles() -> [handle]        (in the library's order; the harness sorts by BDF)
    amdsmi_get_gpu_device_bdf(h) -> "0000:03:00.0"    amdsmi_get_gpu_device_uuid(h) -> str
    amdsmi_get_gpu_asic_info(h) -> {"market_name", "target_graphics_version": "gfx1100", ...}
    amdsmi_get_gpu_process_list(h) -> [{"name", "pid", "mem", "engine_usage": {...},
                                        "memory_usage": {"gtt_mem", "cpu_mem", "vram_mem"}, ...}]
        (6.0/6.1: a list of process handles, each read by amdsmi_get_gpu_process_info(h, p): script
         "old_api": true)
    amdsmi_get_clock_info(h, AmdSmiClkType.GFX | MEM) -> {"clk", "min_clk", "max_clk", ...} (MHz)
    amdsmi_get_power_info(h) -> {"current_socket_power", "average_socket_power", ...} (W, "N/A" if none)
    amdsmi_get_temp_metric(h, AmdSmiTemperatureType.HOTSPOT | EDGE, AmdSmiTemperatureMetric.CURRENT) -> C
    amdsmi_get_energy_count(h) -> {"energy_accumulator", "counter_resolution" (uJ per count), "timestamp"}
    amdsmi_get_gpu_metrics_info(h) -> {..., "throttle_status": bool (int in 6.x) or "N/A", ...}
    amdsmi_get_violation_status(h) -> {"acc_ppt_pwr", "acc_socket_thrm", ...} (MI300+; NOT_SUPPORTED else)
    AmdSmiLibraryException(err_code): .get_error_code(); 2 = AMDSMI_STATUS_NOT_SUPPORTED

Time is counted in samples as in fake_nvml: one tick per process-list read of the first GPU the probe
reads, from 0 at each amdsmi_init; tick 0 is the harness's own reading at open (gpu_amd.AmdSmi learns
there what the GPU does not report), so a server's schedule starts at tick 1 (pre-start).

Script, as configure(dict) in-process:
    gpus          how many GPUs (default 2, the RX 7900 XT pair); bdfs: their PCI addresses (default
                  0000:03:00.0, 0000:07:00.0, ...); `order`: the library's handle order as indices into
                  bdfs (default sorted)
    arch          gfx target (default gfx1100); violation counters answer only on gfx94x/gfx95x
    init_error    amdsmi_init raises AmdSmiLibraryException with this code
    unsupported   names of functions that raise NOT_SUPPORTED ("*": every reading function)
    missing       names of functions this amdsmi lacks (a version skew)
    old_api       the 6.0/6.1 process-handle API
    events        [{"from", "to", "gpu", any of "foreign": [{"pid", "vram_mib"}], "throttle": bool,
                  "ppt_per_tick", "gfx_mhz", "mem_mhz", "power_w", "temp_c"}]
"""

from __future__ import annotations

import time
from enum import IntEnum
from typing import Any

import psutil

__version__ = "7.0.2"

AMDSMI_STATUS_NOT_SUPPORTED = 2
AMDSMI_STATUS_NOT_FOUND = 31
AMDSMI_STATUS_INIT_ERROR = 34
BASE = {"gfx_mhz": 2394, "mem_mhz": 1250, "power_w": 290, "temp_c": 62, "throttle": False}
RESOLUTION_UJ = 15.259  # the counter's resolution on RDNA3 (uJ per count)


class AmdSmiInitFlags(IntEnum):
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_GPUS = 2


class AmdSmiClkType(IntEnum):
    SYS = 0
    GFX = 0
    MEM = 4


class AmdSmiTemperatureType(IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1
    VRAM = 2


class AmdSmiTemperatureMetric(IntEnum):
    CURRENT = 0


class AmdSmiException(Exception):
    pass


class AmdSmiLibraryException(AmdSmiException):
    INFO = {
        AMDSMI_STATUS_NOT_SUPPORTED: "AMDSMI_STATUS_NOT_SUPPORTED - Feature not supported",
        AMDSMI_STATUS_NOT_FOUND: "AMDSMI_STATUS_NOT_FOUND - Device Not found",
        AMDSMI_STATUS_INIT_ERROR: "AMDSMI_STATUS_INIT_ERROR - Initialization error",
    }

    def __init__(self, err_code: int):
        err_code = abs(err_code)
        super().__init__(err_code)
        self.err_code = err_code
        self.err_info = self.INFO.get(err_code, "AMDSMI_STATUS_UNKNOWN_ERROR - An unknown error occurred")

    def __str__(self) -> str:
        return f"Error code:\n\t{self.err_code} | {self.err_info}"

    def get_error_code(self) -> int:
        return self.err_code


_state: dict[str, Any] = {"script": {}, "tick": -1, "t": 0.0, "energy": {}, "ppt": {}, "inits": 0}
_READERS = (
    "amdsmi_get_gpu_process_list",
    "amdsmi_get_gpu_process_info",
    "amdsmi_get_clock_info",
    "amdsmi_get_power_info",
    "amdsmi_get_temp_metric",
    "amdsmi_get_energy_count",
    "amdsmi_get_gpu_metrics_info",
    "amdsmi_get_violation_status",
    "amdsmi_get_gpu_asic_info",
)


def configure(script: dict[str, Any] | None) -> None:
    """A fresh script; a function a former script made missing comes back."""
    for name, fn in _ALL.items():
        globals()[name] = fn
    _state.update(script=script or {}, tick=-1, energy={}, ppt={}, inits=0)
    for name in _state["script"].get("missing", []):
        globals().pop(name, None)
    if not _state["script"].get("old_api"):
        globals().pop("amdsmi_get_gpu_process_info", None)  # gone from 6.2 on


def _s() -> dict[str, Any]:
    return _state["script"]


def _check(name: str) -> None:
    u = _s().get("unsupported", [])
    if name in u or ("*" in u and name in _READERS):
        raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)


def _bdfs() -> list[str]:
    n = int(_s().get("gpus", 2))
    return list(_s().get("bdfs") or [f"0000:{3 + 4 * i:02x}:00.0" for i in range(n)])


class _Handle:
    """The library's processor handle (a ctypes pointer there): opaque, compared by identity."""

    def __init__(self, i: int):
        self.i = i


def amdsmi_init(flag: AmdSmiInitFlags = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
    if _s().get("init_error"):
        raise AmdSmiLibraryException(int(_s()["init_error"]))
    _state.update(tick=-1, t=time.time(), energy={}, ppt={}, inits=_state["inits"] + 1)
    _state.pop("first", None)
    _state["handles"] = [_Handle(i) for i in range(len(_bdfs()))]


def amdsmi_shut_down() -> None:
    pass


def amdsmi_get_processor_handles() -> list[_Handle]:
    hs = _state.get("handles", [])
    order = _s().get("order") or range(len(hs))
    return [hs[i] for i in order]


def amdsmi_get_gpu_device_bdf(h: _Handle) -> str:
    return _bdfs()[h.i]


def amdsmi_get_gpu_device_uuid(h: _Handle) -> str:
    return f"5fff74-fake-{h.i}"


def amdsmi_get_gpu_asic_info(h: _Handle) -> dict[str, Any]:
    _check("amdsmi_get_gpu_asic_info")
    return {
        "market_name": "Radeon RX 7900 XT",
        "vendor_id": "0x1002",
        "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
        "device_id": "0x744c",
        "target_graphics_version": _s().get("arch", "gfx1100"),
        "num_compute_units": 84,
    }


def amdsmi_get_gpu_driver_info(h: _Handle) -> dict[str, Any]:
    return {"driver_name": "amdgpu", "driver_version": "6.10.5", "driver_date": "2015/01/01 00:00"}


def amdsmi_get_gpu_vram_info(h: _Handle) -> dict[str, Any]:
    return {"vram_type": 9, "vram_vendor": "SAMSUNG", "vram_size": 20464, "vram_bit_width": 320}


def amdsmi_get_lib_version() -> dict[str, Any]:
    return {"major": 25, "minor": 5, "release": 1, "build": "0"}


def amdsmi_get_rocm_version() -> tuple[bool, str]:
    return True, "6.4.1"


def _events(gpu: int) -> list[dict[str, Any]]:
    t = _state["tick"]
    return [e for e in _s().get("events", []) if e.get("gpu", 0) == gpu and e.get("from", 0) <= t < e.get("to", 10**9)]


def _value(gpu: int, key: str) -> Any:
    v = BASE[key]
    for e in _events(gpu):
        v = e.get(key, v)
    return v


def _own_pids() -> list[int]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "E2E_SERVER_ID" in p.environ():
                out.append(p.pid)
        except (psutil.Error, OSError):
            continue
    return out


def _procs(gpu: int) -> list[dict[str, Any]]:
    own = [(pid, 8 << 30) for pid in _own_pids()]
    foreign = [(f["pid"], int(f.get("vram_mib", 1024)) << 20) for e in _events(gpu) for f in e.get("foreign", [])]
    return [
        {
            "name": "python3",
            "pid": pid,
            "mem": vram,
            "engine_usage": {"gfx": 0, "enc": 0},
            "memory_usage": {"gtt_mem": 2 << 20, "cpu_mem": 0, "vram_mem": vram},
            "cu_occupancy": "N/A",
        }
        for pid, vram in own + foreign
    ]


def amdsmi_get_gpu_process_list(h: _Handle) -> list[Any]:
    if _state.setdefault("first", h.i) == h.i:  # the first GPU the probe reads: one tick a sample
        _state["tick"] += 1
        now = time.time()
        dt, _state["t"] = now - _state["t"], now
        for g in range(len(_bdfs())):  # the counters run on with the clock
            _state["energy"][g] = _state["energy"].get(g, 0.0) + dt * _value(g, "power_w") * 1e6 / RESOLUTION_UJ
            _state["ppt"][g] = _state["ppt"].get(g, 0) + sum(e.get("ppt_per_tick", 0) for e in _events(g))
    _check("amdsmi_get_gpu_process_list")
    procs = _procs(h.i)
    if _s().get("old_api"):
        _state.setdefault("proc_info", {})[h.i] = {p["pid"]: p for p in procs}
        return [p["pid"] for p in procs]  # amdsmi_process_handle: an integer there too
    return procs


def amdsmi_get_gpu_process_info(h: _Handle, p: int) -> dict[str, Any]:
    _check("amdsmi_get_gpu_process_info")
    info = dict(_state["proc_info"][h.i][p])
    info.pop("cu_occupancy")
    return info


def amdsmi_get_clock_info(h: _Handle, clock_type: AmdSmiClkType) -> dict[str, Any]:
    _check("amdsmi_get_clock_info")
    clk = _value(h.i, "mem_mhz" if clock_type == AmdSmiClkType.MEM else "gfx_mhz")
    return {"clk": clk, "min_clk": 500, "max_clk": 2900, "clk_locked": False, "clk_deep_sleep": 0}


def amdsmi_get_power_info(h: _Handle) -> dict[str, Any]:
    _check("amdsmi_get_power_info")
    w = _value(h.i, "power_w")
    # RDNA3 reports the average only; MI300 the current socket power
    mi = str(_s().get("arch", "gfx1100")).startswith("gfx9")
    return {
        "socket_power": w,
        "current_socket_power": w if mi else "N/A",
        "average_socket_power": "N/A" if mi else w,
        "gfx_voltage": 900,
        "soc_voltage": 800,
        "mem_voltage": 1250,
        "power_limit": 315,
    }


def amdsmi_get_temp_metric(h: _Handle, sensor_type: AmdSmiTemperatureType, metric: AmdSmiTemperatureMetric) -> int:
    _check("amdsmi_get_temp_metric")
    return int(_value(h.i, "temp_c")) - (0 if sensor_type == AmdSmiTemperatureType.HOTSPOT else 10)


def amdsmi_get_energy_count(h: _Handle) -> dict[str, Any]:
    _check("amdsmi_get_energy_count")
    return {
        "energy_accumulator": int(_state["energy"].get(h.i, 0.0)),
        "counter_resolution": RESOLUTION_UJ,
        "timestamp": int(time.time() * 1e9),
    }


def amdsmi_get_gpu_metrics_info(h: _Handle) -> dict[str, Any]:
    _check("amdsmi_get_gpu_metrics_info")
    return {
        "temperature_edge": _value(h.i, "temp_c") - 10,
        "temperature_hotspot": _value(h.i, "temp_c"),
        "average_socket_power": _value(h.i, "power_w"),
        "current_gfxclk": _value(h.i, "gfx_mhz"),
        "current_uclk": _value(h.i, "mem_mhz"),
        "throttle_status": bool(_value(h.i, "throttle")),
        "indep_throttle_status": bool(_value(h.i, "throttle")),
        "current_socket_power": "N/A",
    }


def amdsmi_get_violation_status(h: _Handle) -> dict[str, Any]:
    _check("amdsmi_get_violation_status")
    if not str(_s().get("arch", "gfx1100")).startswith(("gfx94", "gfx95")):
        raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
    return {
        "reference_timestamp": int(time.time() * 1e6),
        "violation_timestamp": 0,
        "acc_counter": _state["tick"],
        "acc_prochot_thrm": 0,
        "acc_ppt_pwr": _state["ppt"].get(h.i, 0),
        "acc_socket_thrm": 0,
        "acc_vr_thrm": 0,
        "acc_hbm_thrm": 0,
        "active_ppt_pwr": False,
        "active_socket_thrm": False,
    }


_ALL = {k: v for k, v in dict(globals()).items() if k.startswith("amdsmi_") and callable(v)}
configure(None)
