"""The state of a server's GPUs around its cells, and the exclusivity policy (--gpu-exclusive).

A foreign process on a cell's GPU moves the cell by more than the minimum effect (issue 23, one H200:
a second vLLM server moved decode -2.4 %, a neighbour decoding back to back more than doubled it),
and nothing else in a run folder would show it. So every server's GPUs are sampled at fixed points,
never inside a timed request (the schedule is a contract: tests script the fake NVML by it):

    pre-start   before the server starts (a GPU already in use is reported before anything is measured)
    ready       the server answers, before its first cell's warm-up
    warm        after a cell's warm-up, before its first timed round
    round R     after timed round R (R from 0)
    bookend R   after closing round R (e2e/stats/bookends.py)

A sample holds, per GPU: its compute processes (each own = in the server's session, or foreign), SM
and memory clocks, power, temperature, the clock-event ("throttle") reasons, and NVML's cumulative
power/thermal violation times and energy. The cumulative counters are why no background sampler
runs: their difference across a round is what happened during its requests, whatever the GPU did
between two samples, and with no thread the timed region costs nothing extra by construction.

NVML through nvidia-ml-py (module `pynvml`), imported on first use; `nvidia-smi` when pynvml cannot
be had (no violation or energy counters there). No GPU, no driver, neither tool: every sample is
{"available": false, "reason": ...} and nothing fails.

Policy, for a foreign process seen from `ready` on (ServerWatch.checkpoint):
    retry (default)  the attempt is void (Contaminated, a ServerGone: e2e/serve/attempts.py measures the cell
                     again on a fresh server within run.retries); its request rows stay, never counted
    warn             counted, and the cell row says `contaminated` (the report lists it)
    fail             the run stops (GpuExclusiveStop); --resume measures the cell again
Before a server starts (ServerWatch.before_start) a foreign process is reported at once; `fail` stops
there, `retry` waits up to wait_s for the GPU to clear and then stops with GpuBusy (the Ray executor
moves the group to another slot instead), `warn` goes on.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import psutil

from e2e.errors import UserError
from e2e.rundir.gpu_rows import VOIDED, cell_summary, describe, samples_file  # noqa: F401 (read by the runner and tests here)
from e2e.safety.safe_io import write_atomic
from e2e.serve.server import ServerGone

POLICIES = ("retry", "warn", "fail")
PRESTART_WAIT_S = 120.0  # retry: how long a GPU held before a start may take to clear
POLL_S = 5.0

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


class Contaminated(ServerGone):
    """retry: a foreign process on the GPU voids the attempt; the cell is measured again."""


class GpuBusy(UserError):
    """retry: the GPU still holds a foreign process before a server starts (after waiting)."""


class GpuExclusiveStop(UserError):
    """fail: a foreign process on a cell's GPU stops the run."""


def reason_names(mask: int | None) -> list[str]:
    return [n for bit, n in REASONS.items() if mask and mask & bit]


def nvml_module() -> Any:
    """pynvml, imported here only. The one seam for tests: E2E_FAKE_NVML names a Python file that
    stands in for it (tests/support/fake_nvml.py: no GPU fault can be produced on a CPU machine)."""
    fake = os.environ.get("E2E_FAKE_NVML")
    if fake:
        if "e2e_fake_nvml" not in sys.modules:
            spec = importlib.util.spec_from_file_location("e2e_fake_nvml", fake)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            sys.modules["e2e_fake_nvml"] = mod
        return sys.modules["e2e_fake_nvml"]
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


# -- reading the GPUs -------------------------------------------------------------------------------
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
        r = subprocess.run(
            [self.exe, *args, "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=15
        )
        if r.returncode != 0:
            lines = (r.stderr or r.stdout).strip().splitlines()
            raise RuntimeError(lines[-1] if lines else f"exit {r.returncode}")
        return [[c.strip() for c in line.split(",")] for line in r.stdout.strip().splitlines() if line.strip()]

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


def _text(x: Any) -> str | None:
    return x.decode() if isinstance(x, bytes) else x


def _num(s: str, conv: Callable[[str], Any] = float) -> Any:
    try:
        return conv(s)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def _open_backend(selectors: list[str]) -> tuple[Any, str | None]:
    """(backend, None), or (None, why nothing can be read): NVML first, nvidia-smi when pynvml is missing
    or cannot start."""
    try:
        nv = nvml_module()
    except ImportError:
        why = "nvidia-ml-py (pynvml) is not installed"
    else:
        try:
            return _Nvml(nv, selectors), None
        except Exception as exc:  # NVMLError_LibraryNotFound on a machine without the driver, ...
            why = f"NVML: {exc}"
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None, f"{why}; no nvidia-smi"
    try:
        return _Smi(exe, selectors), None
    except (RuntimeError, OSError, subprocess.TimeoutExpired, IndexError) as exc:
        return None, f"{why}; nvidia-smi: {exc}"


class GpuProbe:
    """Samples of one set of GPUs. open() never raises: what cannot be read says why in every sample."""

    def __init__(self, selectors: list[str], backend: Any, reason: str | None):
        self.selectors, self.backend, self.reason = selectors, backend, reason

    @classmethod
    def open(cls, env: Mapping[str, str], tp: int) -> GpuProbe:
        selectors, why = server_gpus(env, tp)
        backend = None
        if not why:
            backend, why = _open_backend(selectors)
        return cls(selectors, backend, why)

    @property
    def available(self) -> bool:
        return self.backend is not None

    def sample(self, label: str, leader: int | None = None, server_id: str | None = None) -> dict[str, Any]:
        """One reading, every process marked own (the server's session) or foreign."""
        s: dict[str, Any] = {"label": label, "t_unix": time.time()}
        if self.backend is None:
            return {**s, "available": False, "reason": self.reason}
        try:
            gpus = self.backend.read()
        except Exception as exc:  # a GPU that fell off the bus is a state to record, not a crash
            return {**s, "available": False, "reason": f"{self.backend.source}: {exc}"}
        for g in gpus:
            for p in g["processes"] or []:
                p.update(_whose(p["pid"], leader, server_id))
        return {**s, "available": True, "source": self.backend.source, "gpus": gpus}

    def close(self) -> None:
        if self.backend is not None:
            self.backend.close()


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


# -- the policy over one server group's life ---------------------------------------------------------
class ServerWatch:
    """The GPU checks of a server group (a cell, or an arm-pass's depths), over its attempts.

    The runner calls before_start() before each server, started() once it answers, begin_cell()
    before each cell, checkpoint(label) at each point of the schedule, cell_state() for the row."""

    def __init__(self, probe: GpuProbe, policy: str, note: Callable[[str], None], wait_s: float = PRESTART_WAIT_S):
        if policy not in POLICIES:
            raise UserError(f"--gpu-exclusive {policy!r}: use one of {', '.join(POLICIES)}")
        self.probe, self.policy, self.note, self.wait_s = probe, policy, note, wait_s
        self.leader: int | None = None
        self.server_id: str | None = None
        self.path: Path | None = None
        self.attempt = ""
        self.pre_start: list[dict[str, Any]] = []
        self.contaminated_attempts: dict[str, list[dict[str, Any]]] = {}
        self.cell_id: str | None = None
        self._reset_cell()

    # -- per server --------------------------------------------------------------------------------
    def before_start(self, what: str, attempt: str, samples_path: Path) -> None:
        """The pre-start sample of a new server attempt; a foreign process is reported at once."""
        self.attempt, self.path, self.leader, self.server_id = attempt, samples_path, None, None
        self._reset_cell()  # what an earlier attempt saw is in contaminated_attempts, not this one's state
        s = self._sample("pre-start")
        held = foreign(s)
        self.pre_start = held
        if not held:
            return
        self.note(f"warning: before {what}'s server starts, its GPU holds another process: {describe(held)}")
        if self.policy == "fail":
            raise GpuExclusiveStop(
                f"{describe(held)} before {what}'s server starts (--gpu-exclusive fail): "
                f"nothing measured on it; --resume when the GPU is free"
            )
        if self.policy == "warn":
            return
        deadline = time.monotonic() + self.wait_s
        while held and time.monotonic() < deadline:
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
            held = foreign(self._sample("pre-start"))
        if held:
            raise GpuBusy(
                f"{describe(held)} still on the GPU after {self.wait_s:.0f} s, before {what}'s server "
                "starts (--gpu-exclusive retry): nothing measured on it; --resume when the GPU is free "
                "(or --gpu-exclusive warn to measure beside it)"
            )
        self.note(f"{what}: the GPU is free again; starting its server")

    def load_voided(self, server_dir: Path) -> None:
        """The attempts of this server group that an earlier harness voided (a run resumed after its
        harness stopped or died): each cell row names every voided attempt of its cell, not only this
        process's."""
        for f in sorted(server_dir.glob(f"gpu-a*/{VOIDED}")):
            self._void(json.loads(f.read_text()))

    def _void(self, voided: dict[str, Any]) -> None:
        self.contaminated_attempts.setdefault(voided.get("cell_id") or "", []).append(
            {k: voided[k] for k in ("attempt", "at", "foreign")}
        )

    def started(self, leader: int, server_id: str) -> None:
        self.leader, self.server_id = leader, server_id

    # -- per cell ------------------------------------------------------------------------------------
    def _reset_cell(self) -> None:
        self.samples: list[dict[str, Any]] = []
        self.unreadable: str | None = None
        self.seen: dict[int, dict[str, Any]] = {}  # pid -> foreign process, with first_seen
        self.throttled: dict[int, set[str]] = {}  # round -> reasons
        self.round_power: list[float] = []  # mean W over a round, from the energy counter
        self.prev: dict[str, Any] | None = None
        self.in_bookend = False
        self.bookend_foreign: dict[int, dict[str, Any]] = {}

    def begin_cell(self, cell_id: str) -> None:
        self._reset_cell()
        self.cell_id = cell_id

    def begin_bookend(self) -> None:
        """Closing rounds: recorded for the bookend result, never voiding the cells already measured."""
        self.in_bookend = True

    def checkpoint(self, label: str) -> None:
        s = self._sample(label)
        if not s.get("available"):  # a reading that failed (the probe was open): said in the row
            self.unreadable = s.get("reason")
            return
        self.samples.append(s)
        if label.startswith("round ") and self.prev is not None:
            why = _throttled(self.prev, s)
            if why:
                self.throttled[int(label.split()[1])] = why
            self.round_power += _mean_power(self.prev, s)
        self.prev = s
        held = foreign(s)
        if self.in_bookend:
            for p in held:
                self.bookend_foreign.setdefault(p["pid"], {**p, "first_seen": label})
            return
        new = [p for p in held if p["pid"] not in self.seen]
        for p in new:
            self.seen[p["pid"]] = {**p, "first_seen": label}
        if not held:
            return
        text = f"{describe(held)} on the GPU at '{label}'"
        if self.policy == "retry":
            voided = {"cell_id": self.cell_id, "attempt": self.attempt, "at": label, "foreign": held}
            if self.path is not None:  # on disk beside its readings: a resumed harness still names it
                write_atomic(self.path.parent / VOIDED, json.dumps(voided) + "\n")
            self._void(voided)
            raise Contaminated(f"GPU not exclusive: {text}")
        if self.policy == "fail":
            raise GpuExclusiveStop(
                f"{self.cell_id}: {text} (--gpu-exclusive fail): stopping; this attempt's rows "
                f"are kept, never counted; --resume measures {self.cell_id} again"
            )
        if new:
            self.note(
                f"warning: {self.cell_id}: {describe(new)} on the GPU at '{label}': "
                "counted anyway (--gpu-exclusive warn), the cell is marked contaminated"
            )

    def _sample(self, label: str) -> dict[str, Any]:
        s = self.probe.sample(label, self.leader, self.server_id)
        if self.path is not None and self.probe.available:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:  # the evidence: every reading of this attempt
                f.write(json.dumps(s) + "\n")
        return s

    def cell_state(self, first_cell: bool) -> dict[str, Any]:
        """The cell row's `gpu_state` (formats.GpuCellState). first_cell: the cell that paid the start
        carries the server's pre-start reading."""
        base: dict[str, Any] = {
            "available": self.probe.available,
            "policy": self.policy,
            "contaminated_attempts": self.contaminated_attempts.get(self.cell_id or "", []),
        }
        if not self.probe.available:
            return {**base, "reason": self.probe.reason}
        gpus = self.samples
        first = gpus[0]["gpus"] if gpus else []
        if self.unreadable:
            base["reason"] = f"some readings failed: {self.unreadable}"
        own = [p for s in gpus for g in s["gpus"] for p in g.get("processes") or [] if p.get("own")]
        listed = all(g.get("processes") is not None for s in gpus for g in s["gpus"])

        def span(key: str) -> list[float] | None:
            v = [g[key] for s in gpus for g in s["gpus"] if g.get(key) is not None]
            return [min(v), max(v)] if v else None

        return {
            **base,
            "source": self.probe.backend.source,
            "gpus": [{k: g.get(k) for k in ("index", "uuid", "name")} for g in first],
            "samples": len(gpus),
            "contaminated": bool(self.seen),
            "foreign": list(self.seen.values()),
            "pre_start_foreign": self.pre_start if first_cell else [],
            "own_seen": bool(own) if gpus and listed else None,
            "sm_mhz": span("sm_mhz"),
            "mem_mhz": span("mem_mhz"),
            "power_w": span("power_w"),
            "temp_c": span("temp_c"),
            "round_power_w": [min(self.round_power), max(self.round_power)] if self.round_power else None,
            "throttled_rounds": sorted(self.throttled),
            "throttle_reasons": sorted(set().union(*self.throttled.values())) if self.throttled else [],
        }

    def throttle_warning(self) -> str | None:
        if not self.throttled:
            return None
        why = sorted(set().union(*self.throttled.values()))
        return (
            f"warning: {self.cell_id}: GPU throttled ({', '.join(why)}) during timed round(s) "
            f"{', '.join(str(r) for r in sorted(self.throttled))}"
        )

    def close(self) -> None:
        self.probe.close()


def _throttled(before: dict[str, Any], after: dict[str, Any]) -> set[str]:
    """Why the round between two samples ran throttled: a power/thermal violation time that grew (NVML
    counts it continuously), or a throttle reason at the closing sample."""
    why: set[str] = set()
    for b, a in zip(before["gpus"], after["gpus"]):
        why.update(n for bit, n in REASONS.items() if bit & THROTTLE & (a.get("reasons") or 0))
        for key, name in (("power_violation_ns", "power_violation"), ("thermal_violation_ns", "thermal_violation")):
            if a.get(key) is not None and b.get(key) is not None and a[key] > b[key]:
                why.add(name)
    return why


def _mean_power(before: dict[str, Any], after: dict[str, Any]) -> list[float]:
    """Per GPU, the mean power over the round (energy counter difference / time): the reading under
    load, where a sample between rounds catches the GPU idle for a moment."""
    dt = after["t_unix"] - before["t_unix"]
    return [
        (a["energy_j"] - b["energy_j"]) / dt
        for b, a in zip(before["gpus"], after["gpus"])
        if dt > 0 and a.get("energy_j") is not None and b.get("energy_j") is not None
    ]


# -- for the report and the verdict table -------------------------------------------------------------
