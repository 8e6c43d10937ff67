"""AMD GPUs under ROCm read: the amdsmi package (the optional extra `amd`), else `amd-smi ... --json`,
bounded like nvidia-smi. The rows have gpu_probe's shape, so the policies over them (gpu_state.py) act
unchanged; what an AMD GPU does not report reads None, and which readings those are is said once.

Which GPUs a server uses: ROCR_VISIBLE_DEVICES selects among the GPUs in PCI order (indices, or UUIDs
`GPU-<hex>`), then HIP_VISIBLE_DEVICES (else CUDA_VISIBLE_DEVICES, which HIP honours alike) indexes
what ROCR left, as the ROCm runtime composes them. ROCr enumerates GPUs in PCI bus order, so amdsmi's
handles are sorted by their bus id (BDF) to be matched; every row records its BDF, so a mismatch is
visible.

Readings per GPU, and where they come from:
    processes      amdsmi_get_gpu_process_list (6.0/6.1: process handles + amdsmi_get_gpu_process_info);
                   a HIP process opens every visible GPU, so one counts on a GPU only with VRAM in use there
    sm_mhz/mem_mhz amdsmi_get_clock_info(GFX / MEM)["clk"] (the GFX clock in the SM column)
    power_w        amdsmi_get_power_info: current_socket_power, else average_socket_power (RDNA3)
    temp_c         amdsmi_get_temp_metric(HOTSPOT, else EDGE, CURRENT)
    energy_j       amdsmi_get_energy_count: energy_accumulator x counter_resolution (uJ)
    throttle       amdsmi_get_gpu_metrics_info()["throttle_status"] (bool in 7.x, a mask in 6.x)
    *_violation_acc amdsmi_get_violation_status: acc_ppt_pwr / acc_socket_thrm (MI300 and newer;
                   NOT_SUPPORTED on gfx11, where round throttling rests on the throttle status alone)
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from typing import Any

from e2e.gpu.stand_in import stand_in
from e2e.safety.bounded_run import run_text

SMI_MAX_BYTES = 1 << 20
NOT_SUPPORTED = 2  # amdsmi_wrapper.AMDSMI_STATUS_NOT_SUPPORTED
# what each reading is called when a GPU does not give it
READINGS = {
    "processes": "process list",
    "clocks": "clocks",
    "power": "power",
    "temp": "temperature",
    "energy": "energy counter",
    "throttle": "throttle status",
    "violation": "violation counters",
}


def amdsmi_module() -> Any:
    """amdsmi, imported here only. The test seam, as gpu_probe.nvml_module's: E2E_FAKE_AMDSMI names a
    Python file that stands in for it (tests/support/fake_amdsmi.py)."""
    fake = stand_in("E2E_FAKE_AMDSMI", "e2e_fake_amdsmi")
    if fake is not None:
        return fake
    import amdsmi

    return amdsmi


def _entries(value: str) -> list[str]:
    out = []
    for x in (s.strip() for s in value.split(",")):
        if not x or x.startswith("-"):
            break  # the runtime ignores everything from an invalid entry on
        out.append(x)
    return out


def _hex(s: str) -> str:
    return "".join(c for c in s.lower() if c in "0123456789abcdef")


def select(env: Mapping[str, str], gpus: list[dict[str, Any]], tp: int) -> tuple[list[int], str | None]:
    """Positions in `gpus` (every GPU, in PCI order, each with "bdf" and "uuid") that a server of `tp`
    GPUs uses, or ([], why) in one line: a variable naming a GPU that is not there."""
    listed = f"{len(gpus)} listed: {', '.join(g['bdf'] for g in gpus) or 'none'}"
    pos = list(range(len(gpus)))
    rocr = env.get("ROCR_VISIBLE_DEVICES")
    if rocr is not None:
        chosen = []
        for x in _entries(rocr):
            if x.isdigit():
                hit = int(x) if int(x) < len(gpus) else None
            else:  # GPU-<unique id>: matched on its hex digits against amdsmi's uuid
                want = _hex(x[4:] if x.upper().startswith("GPU-") else x)
                hit = next((i for i, g in enumerate(gpus) if want and want in _hex(g.get("uuid") or "")), None)
            if hit is None:
                return [], f"ROCR_VISIBLE_DEVICES={rocr!r}: no GPU {x} ({listed})"
            chosen.append(hit)
        pos = chosen
    for var in ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        val = env.get(var)
        if not val and var == "HIP_VISIBLE_DEVICES":
            continue  # empty reads as unset (vLLM's ROCm platform does the same: Ray may leave it "")
        if val is None:
            continue
        chosen = []
        for x in _entries(val):
            if not x.isdigit() or int(x) >= len(pos):
                return [], f"{var}={val!r}: no GPU {x} among the {len(pos)} visible ({listed})"
            chosen.append(pos[int(x)])
        pos = chosen
        break  # HIP_VISIBLE_DEVICES wins over CUDA_VISIBLE_DEVICES
    if not pos:
        return [], "the ROCm visibility variables leave the server no GPU"
    return pos[:tp], None


class AmdSmi:
    source = "amdsmi"

    def __init__(self, smi: Any, env: Mapping[str, str], tp: int):
        self.smi = smi
        self.lib_error = smi.AmdSmiLibraryException
        smi.amdsmi_init(smi.AmdSmiInitFlags.INIT_AMD_GPUS)
        try:
            every = sorted(
                ({"h": h, "bdf": smi.amdsmi_get_gpu_device_bdf(h)} for h in smi.amdsmi_get_processor_handles()),
                key=lambda g: g["bdf"],
            )
            for g in every:
                g["uuid"] = self._opt(smi.amdsmi_get_gpu_device_uuid, g["h"])
            pos, why = select(env, every, tp)
            if why:
                raise RuntimeError(why)
            self.handles = [every[i]["h"] for i in pos]
            self.ids = []
            for i in pos:
                asic = self._opt(smi.amdsmi_get_gpu_asic_info, every[i]["h"]) or {}
                self.ids.append(
                    {
                        "index": i,
                        "uuid": every[i]["uuid"],
                        "bdf": every[i]["bdf"],
                        "name": asic.get("market_name"),
                        "arch": asic.get("target_graphics_version"),
                    }
                )
            self.unsupported: set[str] = set()
            self.read()  # once, to learn what this GPU does not give
        except Exception:
            smi.amdsmi_shut_down()
            raise

    def _opt(self, fn: Callable[..., Any], *args: Any, what: str | None = None) -> Any:
        """fn(*args), or None where the GPU or this amdsmi cannot give it: NOT_SUPPORTED (remembered
        under `what`), another library status, or a value of "N/A"."""
        try:
            v = fn(*args)
        except self.lib_error as exc:
            if what and getattr(exc, "get_error_code", lambda: None)() == NOT_SUPPORTED:
                self.unsupported.add(what)
            return None
        return None if v == "N/A" else v

    def _fn(self, name: str) -> Callable[..., Any]:
        """A function of this amdsmi; a version without it reads as NOT_SUPPORTED, never AttributeError."""
        fn = getattr(self.smi, name, None)
        if fn is not None:
            return fn

        def missing(*_: Any) -> Any:
            exc = self.lib_error(NOT_SUPPORTED)
            raise exc

        return missing

    def _processes(self, h: Any) -> list[dict[str, Any]] | None:
        procs = self._opt(self._fn("amdsmi_get_gpu_process_list"), h, what="processes")
        if procs is None:
            return None
        out = []
        for p in procs:
            if not isinstance(p, dict):  # 6.0/6.1: a process handle, read on its own
                p = self._opt(self._fn("amdsmi_get_gpu_process_info"), h, p, what="processes")
                if p is None:
                    return None
            vram = (p.get("memory_usage") or {}).get("vram_mem")
            if isinstance(vram, (int, float)) and vram > 0:  # opened this GPU without using it: not here
                out.append({"pid": int(p["pid"]), "used_mib": vram / 2**20})
        return out

    def _clock(self, h: Any, kind: Any) -> Any:
        c = self._opt(self._fn("amdsmi_get_clock_info"), h, kind, what="clocks")
        return _number(c.get("clk")) if isinstance(c, dict) else None

    def read(self) -> list[dict[str, Any]]:
        smi, out = self.smi, []
        temp = self._fn("amdsmi_get_temp_metric")
        for ident, h in zip(self.ids, self.handles):
            procs = self._processes(h)
            power = self._opt(self._fn("amdsmi_get_power_info"), h, what="power") or {}
            watts = _number(power.get("current_socket_power"))
            if watts is None:
                watts = _number(power.get("average_socket_power"))
            t = self._opt(temp, h, smi.AmdSmiTemperatureType.HOTSPOT, smi.AmdSmiTemperatureMetric.CURRENT)
            if t is None:
                t = self._opt(temp, h, smi.AmdSmiTemperatureType.EDGE, smi.AmdSmiTemperatureMetric.CURRENT, what="temp")
            energy = self._opt(self._fn("amdsmi_get_energy_count"), h, what="energy")
            metrics = self._opt(self._fn("amdsmi_get_gpu_metrics_info"), h, what="throttle") or {}
            viol = self._opt(self._fn("amdsmi_get_violation_status"), h, what="violation") or {}
            throttle = metrics.get("throttle_status")
            out.append(
                {
                    **ident,
                    "processes": procs,
                    "sm_mhz": self._clock(h, smi.AmdSmiClkType.GFX),
                    "mem_mhz": self._clock(h, smi.AmdSmiClkType.MEM),
                    "power_w": watts,
                    "temp_c": _number(t),
                    "reasons": None,
                    "throttle": None if throttle in (None, "N/A") else bool(throttle),
                    "energy_j": _energy_j(energy),
                    "power_violation_ns": None,
                    "thermal_violation_ns": None,
                    "power_violation_acc": _number(viol.get("acc_ppt_pwr")),
                    "thermal_violation_acc": _number(viol.get("acc_socket_thrm")),
                }
            )
        if not any(g["throttle"] is not None for g in out):
            self.unsupported.add("throttle")
        return out

    def notice(self) -> str | None:
        """The readings this GPU does not give, in one line (None: it gives them all)."""
        if not self.unsupported:
            return None
        names = [READINGS[k] for k in READINGS if k in self.unsupported]
        tail = ""
        if "processes" in self.unsupported:
            tail = ": another process on the GPU would not be seen"
        elif self.unsupported == {"violation"}:
            tail = " (MI300 and newer have them): round throttling rests on the throttle status"
        arch = ", ".join(sorted({str(i.get("arch")) for i in self.ids}))
        return f"amdsmi: {arch} does not report its {', '.join(names)}{tail}"

    def close(self) -> None:
        try:
            self.smi.amdsmi_shut_down()
        except self.lib_error:
            pass


class AmdSmiCli:
    """`amd-smi ... --json` when the amdsmi package cannot be had: clocks, power, temperature,
    energy, processes. Its JSON shape differs across ROCm releases (values as {"value", "unit"}, or
    numbers, or "290 W"); whatever is not found reads None."""

    source = "amd-smi"

    def __init__(self, exe: str, env: Mapping[str, str], tp: int, deadline: float):
        self.exe, self.deadline = exe, deadline
        every = sorted(
            ({"gpu": g.get("gpu"), "bdf": g.get("bdf") or "", "uuid": g.get("uuid")} for g in self._json("list")),
            key=lambda g: str(g["bdf"]),
        )
        pos, why = select(env, every, tp)
        if why:
            raise RuntimeError(why)
        self.ids = [{"index": i, "uuid": every[i]["uuid"], "bdf": every[i]["bdf"], "name": None} for i in pos]
        self.gpu_ids = [every[i]["gpu"] for i in pos]
        self.unsupported: set[str] = {"violation", "throttle"}

    def _json(self, *args: str) -> list[dict[str, Any]]:
        text = run_text([self.exe, *args, "--json"], self.deadline, SMI_MAX_BYTES)
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise RuntimeError(f"amd-smi {args[0]} --json printed no JSON ({exc})") from None
        if isinstance(data, dict):  # some releases wrap the list
            data = next((v for v in data.values() if isinstance(v, list)), [data])
        if not isinstance(data, list):
            raise RuntimeError(f"amd-smi {args[0]} --json: not a list of GPUs")
        return [d for d in data if isinstance(d, dict)]

    def read(self) -> list[dict[str, Any]]:
        metrics = {m.get("gpu"): m for m in self._json("metric")}
        procs: dict[Any, list[dict[str, Any]]] = {}
        for g in self._json("process"):
            for p in g.get("process_list") or []:
                info = p.get("process_info", p) if isinstance(p, dict) else {}
                vram = _number((info.get("memory_usage") or {}).get("vram_mem"), bytes_=True)
                if isinstance(info, dict) and info.get("pid") is not None and vram:
                    procs.setdefault(g.get("gpu"), []).append({"pid": int(info["pid"]), "used_mib": vram / 2**20})
        out = []
        for ident, gid in zip(self.ids, self.gpu_ids):
            m = metrics.get(gid, {})
            clock, power, temp = m.get("clock") or {}, m.get("power") or {}, m.get("temperature") or {}
            gfx = clock.get("gfx_0") or clock.get("gfx") or {}
            mem = clock.get("mem_0") or clock.get("mem") or {}
            watts = _number(power.get("socket_power"))
            energy = (m.get("energy") or {}).get("total_energy_consumption")
            out.append(
                {
                    **ident,
                    "processes": procs.get(gid, []),
                    "sm_mhz": _number(gfx.get("clk") if isinstance(gfx, dict) else gfx),
                    "mem_mhz": _number(mem.get("clk") if isinstance(mem, dict) else mem),
                    "power_w": watts,
                    "temp_c": _number(temp.get("hotspot")) or _number(temp.get("edge")),
                    "reasons": None,
                    "throttle": None,
                    "energy_j": _number(energy),
                    "power_violation_ns": None,
                    "thermal_violation_ns": None,
                    "power_violation_acc": None,
                    "thermal_violation_acc": None,
                }
            )
        return out

    def notice(self) -> str | None:
        return "amd-smi: no throttle status or violation counters from the command line: throttling is not seen"

    def close(self) -> None:
        pass


def _number(v: Any, bytes_: bool = False) -> float | None:
    """A reading as a number: a number, {"value": x, "unit": u}, or "x unit"; None for "N/A" and the
    like. bytes_: a memory size, scaled from its unit to bytes."""
    unit = ""
    if isinstance(v, dict):
        v, unit = v.get("value"), str(v.get("unit") or "")
    if isinstance(v, str):
        head, _, unit = v.strip().partition(" ")
        try:
            v = float(head)
        except ValueError:
            return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if bytes_:
        v *= {"KB": 2**10, "MB": 2**20, "GB": 2**30, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}.get(unit.strip(), 1)
    return float(v)


def _energy_j(e: Any) -> float | None:
    if not isinstance(e, dict):
        return None
    acc, res = _number(e.get("energy_accumulator")), _number(e.get("counter_resolution"))
    return None if acc is None or res is None else acc * res / 1e6


def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read(200).strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def _smi_inventory(smi: Any) -> dict[str, Any]:
    """Every AMD GPU in PCI order with its driver, VRAM and gfx arch; the library's and ROCm's versions."""
    lib_error = smi.AmdSmiLibraryException

    def opt(name: str, *args: Any) -> Any:
        fn = getattr(smi, name, None)
        try:
            return fn(*args) if fn else None
        except lib_error:
            return None

    smi.amdsmi_init(smi.AmdSmiInitFlags.INIT_AMD_GPUS)
    try:
        gpus = []
        for h in sorted(smi.amdsmi_get_processor_handles(), key=smi.amdsmi_get_gpu_device_bdf):
            asic = opt("amdsmi_get_gpu_asic_info", h) or {}
            driver = opt("amdsmi_get_gpu_driver_info", h) or {}
            vram = opt("amdsmi_get_gpu_vram_info", h) or {}
            gpus.append(
                {
                    "bdf": smi.amdsmi_get_gpu_device_bdf(h),
                    "name": asic.get("market_name"),
                    "gfx_arch": asic.get("target_graphics_version"),
                    "driver": driver.get("driver_version"),
                    "vram_mib": vram.get("vram_size"),  # amdsmi gives MB
                }
            )
        out: dict[str, Any] = {"gpus": gpus}
        lib = opt("amdsmi_get_lib_version")
        if isinstance(lib, dict):
            out["amdsmi_lib"] = ".".join(str(lib.get(k)) for k in ("major", "minor", "release"))
        rocm = opt("amdsmi_get_rocm_version")
        if isinstance(rocm, (tuple, list)) and len(rocm) == 2 and rocm[0]:
            out["rocm"] = str(rocm[1])
        return out
    finally:
        smi.amdsmi_shut_down()


def provenance(env: Mapping[str, str], deadline: float, within: Callable[..., Any]) -> dict[str, Any]:
    """The manifest's AMD facts: {} on a machine without ROCm or amdsmi (nothing AMD to say).
    ROCm's version from its install (ROCM_PATH, else /opt/rocm: .info/version) or amdsmi; the
    amdgpu kernel module's version where it is a DKMS build (an in-kernel driver has none)."""
    out: dict[str, Any] = {}
    root = env.get("ROCM_PATH") or env.get("ROCM_HOME") or "/opt/rocm"
    rocm = _read_text(os.path.join(root, ".info", "version"))
    if rocm:
        out["rocm"] = rocm
    kmod = _read_text("/sys/module/amdgpu/version")
    if kmod:
        out["amdgpu_module"] = kmod
    try:
        smi = amdsmi_module()
    except ImportError:
        return out
    except Exception as exc:  # a broken install: said, never a traceback
        return {**out, "amdsmi_error": f"{type(exc).__name__}: {str(exc)[:160]}"}
    try:
        got = within(lambda: _smi_inventory(smi), "amdsmi", deadline)
    except Exception as exc:
        return {**out, "amdsmi_error": getattr(exc, "err_info", None) or " ".join(str(exc).split())[:200]}
    return {**got, **out}  # ROCm's own file over amdsmi's reading of it


def open_amd(
    env: Mapping[str, str], tp: int, deadline: float, within: Callable[..., Any]
) -> tuple[AmdSmi | AmdSmiCli | None, str]:
    """(backend, "") or (None, why nothing AMD can be read, naming what was tried). `within` runs the
    library's start under the probe's deadline (a wedged driver)."""
    try:
        smi = amdsmi_module()
    except ImportError:
        why = "amdsmi is not installed (pip install '.[amd]')"
    except Exception as exc:  # a broken install: its own import fails
        why = f"amdsmi cannot be imported: {type(exc).__name__}: {str(exc)[:160]}"
    else:
        try:
            return within(lambda: AmdSmi(smi, env, tp), "amdsmi", deadline), ""
        except AttributeError as exc:  # a version without what the harness calls at start
            why = f"amdsmi {getattr(smi, '__version__', '?')} lacks {exc.name or exc}: use amdsmi>=6.1"
        except Exception as exc:  # AmdSmiLibraryException (no driver), Wedged, a GPU that is not there
            # AmdSmiLibraryException's own text spans lines ("Error code:\n\t34 | ..."): its status only
            why = f"amdsmi: {getattr(exc, 'err_info', None) or ' '.join(str(exc).split())}"
    exe = shutil.which("amd-smi")
    if exe is None:
        return None, f"{why}; no amd-smi"
    try:
        return AmdSmiCli(exe, env, tp, deadline), ""
    except (RuntimeError, OSError) as exc:
        return None, f"{why}; amd-smi: {exc}"
