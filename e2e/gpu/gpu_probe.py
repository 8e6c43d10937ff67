"""One server's GPUs read: NVML, or nvidia-smi where pynvml cannot be had, every compute process
marked own (the server's) or foreign. The schedule of readings and the policy over them are
e2e/gpu/gpu_state.py's.

NVML through nvidia-ml-py (module `pynvml`), imported on first use; `nvidia-smi` when pynvml cannot
be had (no violation or energy counters there); where neither reads a GPU, AMD's amdsmi, else
`amd-smi` (e2e/gpu/gpu_amd.py: ROCm, rows of the same shape). No GPU, no driver, no tool: every
sample is {"available": false, "reason": ...} naming each thing tried, and nothing fails.

Every reading has a deadline (DEADLINE_S): a wedged driver blocks an NVML call in C, where nothing
can interrupt it, so the reading runs on a daemon thread that is left behind when it does not answer,
and the probe says so in every later sample instead of calling into the driver again. nvidia-smi runs
bounded (e2e/safety/bounded_run.py: its output read to at most SMI_MAX_BYTES within the deadline,
its group killed past either); output that is not UTF-8 is a failed reading, one line, never a
traceback.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import psutil

from e2e.gpu import gpu_amd
from e2e.gpu.stand_in import stand_in
from e2e.safety.bounded_run import run_text

DEADLINE_S = 15.0  # one reading, or opening the backend (NVML answers in milliseconds)
SMI_MAX_BYTES = 1 << 20  # nvidia-smi's CSV for eight GPUs and their processes is a few KB

# NVML's clock-event reasons (nvmlClocksEventReason*, "throttle reasons" in older drivers).
REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clocks",
}
THROTTLE = 0x4 | 0x8 | 0x20 | 0x40 | 0x80  # power or thermal: what slows a timed request


class Backend(Protocol):
    """What reads the GPUs: NVML, nvidia-smi, amdsmi or amd-smi."""

    source: str

    def read(self) -> list[dict[str, Any]]: ...

    def close(self) -> None: ...


def reason_names(mask: int | None) -> list[str]:
    return [n for bit, n in REASONS.items() if mask and mask & bit]


def nvml_module() -> Any:
    """pynvml, imported here only. The one seam for tests: E2E_FAKE_NVML names a Python file that
    stands in for it (tests/support/fake_nvml.py: no GPU fault can be produced on a CPU machine)."""
    fake = stand_in("E2E_FAKE_NVML", "e2e_fake_nvml")
    if fake is not None:
        return fake
    import pynvml

    return pynvml


def server_gpus(env: Mapping[str, str], tp: int) -> tuple[list[str], str | None]:
    """The GPUs a server uses: the first `tp` of CUDA_VISIBLE_DEVICES (indices or UUIDs), else
    0..tp-1. NVML numbers GPUs in PCI order, CUDA fastest-first: the same on a machine of one GPU
    model; the samples record each GPU's UUID, so a mismatch is visible."""
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is None:
        return [str(i) for i in range(tp)], None
    ids = []
    for x in (s.strip() for s in cvd.split(",")):
        if not x or x.startswith("-"):
            break  # CUDA ignores everything from an invalid entry on
        ids.append(x)
    if not ids:
        return [], f"CUDA_VISIBLE_DEVICES={cvd!r}: the server sees no GPU"
    return ids[:tp], None


class _Nvml:
    source = "nvml"

    def __init__(self, nv: Any, selectors: list[str]):
        self.nv = nv
        nv.nvmlInit()
        try:
            self.handles = [
                nv.nvmlDeviceGetHandleByIndex(int(s)) if s.isdigit() else nv.nvmlDeviceGetHandleByUUID(s)
                for s in selectors
            ]
            self.ids = [
                {
                    "index": self._opt(nv.nvmlDeviceGetIndex, h),
                    "uuid": _text(self._opt(nv.nvmlDeviceGetUUID, h)),
                    "name": _text(self._opt(nv.nvmlDeviceGetName, h)),
                }
                for h in self.handles
            ]
        except Exception:
            nv.nvmlShutdown()
            raise
        self.reasons = (
            getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        )

    def _opt(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self.nv.NVMLError:  # not supported on this GPU or driver: the field reads None
            return None

    def read(self) -> list[dict[str, Any]]:
        nv, out = self.nv, []
        for ident, h in zip(self.ids, self.handles):
            procs = self._opt(nv.nvmlDeviceGetComputeRunningProcesses, h)
            power = self._opt(nv.nvmlDeviceGetPowerUsage, h)
            energy = self._opt(nv.nvmlDeviceGetTotalEnergyConsumption, h)
            viol = {
                k: self._opt(nv.nvmlDeviceGetViolationStatus, h, p)
                for k, p in (
                    ("power_violation_ns", nv.NVML_PERF_POLICY_POWER),
                    ("thermal_violation_ns", nv.NVML_PERF_POLICY_THERMAL),
                )
            }
            out.append(
                {
                    **ident,
                    "processes": None
                    if procs is None
                    else [
                        {"pid": int(p.pid), "used_mib": None if p.usedGpuMemory is None else p.usedGpuMemory / 2**20}
                        for p in procs
                    ],
                    "sm_mhz": self._opt(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
                    "mem_mhz": self._opt(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
                    "power_w": None if power is None else power / 1e3,
                    "temp_c": self._opt(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
                    "reasons": self._opt(self.reasons, h),
                    "energy_j": None if energy is None else energy / 1e3,
                    **{k: None if v is None else int(v.violationTime) for k, v in viol.items()},
                }
            )
        return out

    def close(self) -> None:
        try:
            self.nv.nvmlShutdown()
        except self.nv.NVMLError:
            pass


class _Smi:
    """nvidia-smi's CSV, when pynvml is missing: clocks, power, temperature, reasons, processes."""

    source = "nvidia-smi"
    FIELDS = ("index", "uuid", "name", "clocks.sm", "clocks.mem", "power.draw", "temperature.gpu")

    def __init__(self, exe: str, selectors: list[str]):
        self.exe = exe
        self.reason_field = "clocks_event_reasons.active"
        try:
            rows = self._gpus()
        except RuntimeError:
            self.reason_field = "clocks_throttle_reasons.active"  # drivers before 535
            rows = self._gpus()
        by = {**{r["uuid"]: r for r in rows}, **{str(r["index"]): r for r in rows}}
        missing = [s for s in selectors if s not in by]
        if missing:
            raise RuntimeError(f"nvidia-smi lists no GPU {', '.join(missing)}")
        self.uuids = [by[s]["uuid"] for s in selectors]
        self.ids = [{k: by[s][k] for k in ("index", "uuid", "name")} for s in selectors]

    def _query(self, *args: str) -> list[list[str]]:
        stdout = run_text([self.exe, *args, "--format=csv,noheader,nounits"], DEADLINE_S, SMI_MAX_BYTES)
        return [[c.strip() for c in line.split(",")] for line in stdout.strip().splitlines() if line.strip()]

    def _gpus(self) -> list[dict[str, Any]]:
        out = []
        for c in self._query(f"--query-gpu={','.join(self.FIELDS + (self.reason_field,))}"):
            out.append(
                {
                    "index": _num(c[0], int),
                    "uuid": c[1],
                    "name": c[2],
                    "sm_mhz": _num(c[3]),
                    "mem_mhz": _num(c[4]),
                    "power_w": _num(c[5]),
                    "temp_c": _num(c[6]),
                    "reasons": _num(c[7], lambda x: int(x, 16)),
                }
            )
        return out

    def read(self) -> list[dict[str, Any]]:
        gpus = {g["uuid"]: g for g in self._gpus()}
        procs: dict[str, list[dict[str, Any]]] = {}
        for uuid, pid, mib in self._query("--query-compute-apps=gpu_uuid,pid,used_memory"):
            procs.setdefault(uuid, []).append({"pid": int(pid), "used_mib": _num(mib)})
        return [
            {
                **gpus[u],
                "processes": procs.get(u, []),
                "energy_j": None,
                "power_violation_ns": None,
                "thermal_violation_ns": None,
            }
            for u in self.uuids
        ]

    def close(self) -> None:
        pass


class Wedged(RuntimeError):
    """A reading that did not answer within its deadline."""


def within(fn: Callable[[], Any], what: str, timeout: float) -> Any:
    """fn() on a daemon thread, waited for at most `timeout` s. A call into a wedged driver cannot be
    interrupted: past the deadline it is left behind (a daemon never holds up the exit) and Wedged
    is raised; fn's own exception otherwise."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    t = threading.Thread(target=run, name=f"gpu reading ({what})", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise Wedged(f"{what} did not answer within {timeout:g} s (a wedged driver?); no more readings of it")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _text(x: Any) -> str | None:
    """A name NVML gives as bytes: any byte shown, never a decoding error."""
    return x.decode("utf-8", "backslashreplace") if isinstance(x, bytes) else x


def _num(s: str, conv: Callable[[str], Any] = float) -> Any:
    try:
        return conv(s)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def _open_backend(selectors: list[str]) -> tuple[Backend | None, str | None]:
    """(backend, None), or (None, why nothing can be read): NVML first, nvidia-smi when pynvml is missing
    or cannot start."""
    try:
        nv = nvml_module()
    except ImportError:
        why = "nvidia-ml-py (pynvml) is not installed"
    else:
        try:
            return within(lambda: _Nvml(nv, selectors), "NVML", DEADLINE_S), None
        except Exception as exc:  # NVMLError_LibraryNotFound on a machine without the driver, Wedged, ...
            why = f"NVML: {exc}"
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, f"{why}; no nvidia-smi"
    try:
        return _Smi(exe, selectors), None
    except (RuntimeError, OSError, IndexError) as exc:
        return None, f"{why}; nvidia-smi: {exc}"


class GpuProbe:
    """Samples of one set of GPUs. open() never raises: what cannot be read says why in every sample."""

    def __init__(self, selectors: list[str], backend: Backend | None, reason: str | None):
        self.selectors, self.backend, self.reason = selectors, backend, reason

    @classmethod
    def open(cls, env: Mapping[str, str], tp: int) -> GpuProbe:
        selectors, why = server_gpus(env, tp)
        backend: Backend | None = None
        if not why:
            backend, why = _open_backend(selectors)
        if backend is None:  # no NVIDIA GPU read: an AMD one (ROCm has its own visibility variables)
            backend, amd_why = gpu_amd.open_amd(env, tp, DEADLINE_S, within)
            why = None if backend is not None else f"{why}; {amd_why}"
        return cls(selectors, backend, why)

    @property
    def available(self) -> bool:
        return self.backend is not None

    def notice(self) -> str | None:
        """What this GPU does not report (an AMD GPU's NOT_SUPPORTED readings), in one line."""
        fn = getattr(self.backend, "notice", None)
        return fn() if fn else None

    def sample(self, label: str, leader: int | None = None, server_id: str | None = None) -> dict[str, Any]:
        """One reading, every process marked own (the server's session) or foreign."""
        s: dict[str, Any] = {"label": label, "t_unix": time.time()}
        if self.backend is None:
            return {**s, "available": False, "reason": self.reason}
        try:
            gpus = within(self.backend.read, self.backend.source, DEADLINE_S)
        except Wedged as exc:  # every later sample says so at once: no call waits on a wedged driver
            self.reason = f"{self.backend.source}: {exc}"
            self.backend = None
            return {**s, "available": False, "reason": self.reason}
        except Exception as exc:  # a GPU that fell off the bus is a state to record, not a crash
            return {**s, "available": False, "reason": f"{self.backend.source}: {exc}"}
        for g in gpus:
            for p in g["processes"] or []:
                p.update(_whose(p["pid"], leader, server_id))
        return {**s, "available": True, "source": self.backend.source, "gpus": gpus}

    def close(self) -> None:
        """Let the backend go, under the same deadline: a driver that wedges at nvmlShutdown must
        not hold up the end of the run."""
        if self.backend is not None:
            try:
                within(self.backend.close, f"{self.backend.source} shutdown", DEADLINE_S)
            except Wedged as exc:
                self.reason, self.backend = f"{self.backend.source}: {exc}", None


def _whose(pid: int, leader: int | None, server_id: str | None) -> dict[str, Any]:
    """own: in the server's session (it is started with start_new_session, so the session id is the
    leader's pid) or carrying its E2E_SERVER_ID. A pid this host cannot see (another pid namespace)
    is foreign: nothing proves it ours."""
    try:
        proc = psutil.Process(pid)
        name = proc.name()
    except psutil.NoSuchProcess:
        return {"own": False, "visible": False, "name": None}
    except psutil.AccessDenied:
        return {"own": False, "visible": True, "name": None}
    own = False
    if leader is not None:
        try:
            own = os.getsid(pid) == leader
        except OSError:
            pass
        if not own and server_id:
            try:
                own = proc.environ().get("E2E_SERVER_ID") == server_id
            except (psutil.Error, OSError):
                pass
    return {"own": own, "visible": True, "name": name}


def foreign(sample: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "gpu": g.get("index"),
            "pid": p["pid"],
            "name": p.get("name"),
            "used_mib": p.get("used_mib"),
            "visible": p.get("visible", True),
        }
        for g in sample.get("gpus") or []
        for p in g.get("processes") or []
        if not p.get("own")
    ]
