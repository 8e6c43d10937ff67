"""Startup phases from real vLLM server logs (fixtures: trimmed copies of results/*/logs, routes and
request lines dropped), values read off the logs by hand; plus fuzzing that parsing never raises."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from e2e.serve import startup_phases as sp
from tests.support import ROOT

DATA = ROOT / "tests" / "data"
COLD = DATA / "vllm026-h200-tp2-cold.log"  # results/h200-plugin-proof/logs/p1-fa.a0.log
TWO = DATA / "vllm026-h200-tp2-two-starts-cache-hit.log"  # .../p1-rocm-widened.a0.log
CPU = DATA / "vllm032-cpu-eager.log"  # results/cpu-demo/logs/p1-d256-stock.a0.log
GAPS = ("api_to_engine_s", "engine_to_worker_s", "worker_to_init_end_s", "init_end_to_api_s")


def test_vllm026_h200_tp2_cold_start():
    p = sp.from_log_file(COLD)
    assert list(p) == list(sp.KEYS)
    # banner 19:07:50, first EngineCore 19:08:33, first Worker 19:08:58, init engine end 19:09:57,
    # "Starting vLLM server on" 19:10:03; last "Graph capturing finished" 19:09:39
    assert p == {
        "vllm_version": "0.26.0",
        "starts_in_log": 1,
        "api_to_engine_s": 43.0,
        "engine_to_worker_s": 25.0,
        "worker_to_init_end_s": 59.0,
        "init_end_to_api_s": 6.0,
        "total_logged_s": 133.0,
        "weights_s": 0.12,
        "model_load_s": 1.933876,
        "dynamo_s": 4.0,
        "compile_s": 27.19,
        "engine_compile_s": 30.70,
        "compile_cache": "miss",
        "compile_cache_dir": "/root/.cache/vllm/torch_compile_cache/86a97d1231/rank_0_0/backbone",
        "graph_capture_s": 2.0,
        "after_capture_s": 18.0,
        "engine_init_s": 54.91,
        "found": [
            "api_ready",
            "banner",
            "capture_end",
            "compile",
            "compile_cache_dir",
            "compile_cache_miss",
            "dynamo",
            "engine",
            "graph_capture",
            "init_end",
            "model_load",
            "weights",
            "worker",
        ],
    }


def test_two_starts_reports_the_last_one_a_compile_cache_hit():
    p = sp.from_log_file(TWO)
    assert p["starts_in_log"] == 2
    # second start: banner 19:17:19, EngineCore 19:17:42, Worker 19:18:05, init end 19:18:31, API 19:18:37
    assert [p[k] for k in GAPS] == [23.0, 23.0, 26.0, 6.0] and p["total_logged_s"] == 78.0
    assert p["compile_cache"] == "hit" and p["compile_s"] == 2.91 and p["engine_compile_s"] == 3.93
    assert p["dynamo_s"] == 1.65 and p["graph_capture_s"] == 2.0 and p["after_capture_s"] == 13.0
    assert p["engine_init_s"] == 21.81 and p["weights_s"] == 0.09 and p["model_load_s"] == 2.351059
    # the first start (killed after the engine's first lines) on its own: what is absent is None
    lines = TWO.read_bytes().split(b"\n")
    second = next(i for i, x in enumerate(lines) if x.startswith(b"# argv:") and i > 0)
    first = sp.parse(b"\n".join(lines[:second]))
    assert first["starts_in_log"] == 1 and first["api_to_engine_s"] == 27.0  # 19:15:30 -> 19:15:57
    assert first["engine_to_worker_s"] is None and first["total_logged_s"] is None
    assert first["compile_cache"] is None and first["engine_init_s"] is None
    assert first["found"] == ["banner", "engine"]


def test_vllm032_cpu_eager_has_no_compile_and_no_graphs():
    p = sp.from_log_file(CPU)
    # banner 22:32:28, EngineCore 22:33:09, VllmWorker-0 22:33:30, init end 22:33:36, API 22:33:39
    assert p["vllm_version"] == "0.32.0"
    assert [p[k] for k in GAPS] == [41.0, 21.0, 6.0, 3.0] and p["total_logged_s"] == 71.0
    assert p["weights_s"] == 0.68 and p["engine_init_s"] == 2.34 and p["engine_compile_s"] is None
    for k in (
        "model_load_s",
        "dynamo_s",
        "compile_s",
        "compile_cache",
        "compile_cache_dir",
        "graph_capture_s",
        "after_capture_s",
    ):
        assert p[k] is None, k
    assert p["found"] == ["api_ready", "banner", "engine", "init_end", "weights", "worker"]


@pytest.mark.parametrize("log", [COLD, TWO, CPU], ids=lambda x: x.name)
def test_the_gaps_partition_the_logged_start(log):
    p = sp.from_log_file(log)
    assert sum(p[k] for k in GAPS) == p["total_logged_s"]


def _log(*lines: str) -> str:
    return "\n".join(["# argv: vllm serve m"] + list(lines))


def test_day_and_year_roll_over():
    log = _log(
        "(APIServer pid=1) INFO 12-31 23:59:50 [api_utils.py:1] non-default args: {}",
        "(EngineCore pid=2) INFO 01-01 00:00:20 [core.py:1] Initializing a V1 LLM engine (v9.1.0) with",
        "(Worker_TP0 pid=3) INFO 01-01 00:01:00 [x.py:1] hello",
        "(EngineCore pid=2) INFO 01-01 00:02:00 [core.py:1] init engine (profile, create kv cache, warmup model) took 50.00 s",
        "(APIServer pid=1) INFO 01-01 00:02:05 [api_server.py:1] Starting vLLM server on http://x",
    )
    p = sp.parse(log)
    assert p["api_to_engine_s"] == 30.0 and p["total_logged_s"] == 135.0 and p["vllm_version"] == "9.1.0"
    midnight = sp.parse(log.replace("12-31", "11-29").replace("01-01", "11-30"))
    assert midnight["api_to_engine_s"] == 30.0 and midnight["init_end_to_api_s"] == 5.0


def test_partial_cache_max_over_workers_and_ansi_colours():
    log = _log(
        "\x1b[1;36m(Worker_TP0 pid=3)\x1b[0m INFO 11-29 10:00:00 [b.py:1] Directly load the compiled graph(s) for compile range (1, 8) from the cache, took 1.0 s",
        "(Worker_TP1 pid=4) INFO 11-29 10:00:01 [b.py:2] Compiling a graph for compile range (8, 16) takes 3.00 s",
        "(Worker_TP0 pid=3) INFO 11-29 10:00:02 [m.py:1] Graph capturing finished in 4 secs, took 0.1 GiB",
        "(Worker_TP1 pid=4) INFO 11-29 10:00:05 [m.py:1] Graph capturing finished in 7 secs, took 0.1 GiB",
        "(EngineCore pid=2) INFO 11-29 10:00:09 [core.py:1] init engine (profile, create kv cache, warmup model) took 9.5 s (compilation: 3.0 s)",
    )
    p = sp.parse(log)
    assert p["compile_cache"] == "partial" and p["graph_capture_s"] == 7.0 and p["after_capture_s"] == 4.0
    assert p["engine_to_worker_s"] is None  # markers out of order (engine's first line after the workers'): no gap
    assert p["engine_compile_s"] == 3.0


def test_non_utf8_bytes_and_crlf_do_not_change_the_figures():
    raw = COLD.read_bytes()
    noisy = raw.replace(b"\n", b"\r\n").replace(b"Route:", b"\xff\xfeRoute:").replace(b"Loading safetensors", b"\xc3(")
    assert sp.parse(noisy) == sp.parse(raw)


def test_unreadable_file_and_non_text(tmp_path):
    assert sp.from_log_file(tmp_path / "absent.log")["found"] == ["unreadable"]
    for x in (None, 42, "", b""):
        p = sp.parse(x)
        assert list(p) == list(sp.KEYS) and p["found"] == [] and p["starts_in_log"] == 0


def _well_formed(p: dict) -> None:
    assert list(p) == list(sp.KEYS)
    for k, v in p.items():
        if k.endswith("_s"):
            assert v is None or isinstance(v, float), (k, v)
    assert p["compile_cache"] in (None, "hit", "miss", "partial")
    assert isinstance(p["found"], list) and isinstance(p["starts_in_log"], int)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=4000))
def test_random_bytes_never_raise(data):
    _well_formed(sp.parse(data))


REAL_LINES = COLD.read_text(encoding="utf-8").split("\n")


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from(REAL_LINES),
            st.text(max_size=200),
            st.sampled_from(REAL_LINES).map(lambda s: s[: len(s) // 2]),
        ),
        max_size=60,
    )
)
def test_real_lines_shuffled_cut_and_mixed_with_garbage_never_raise(lines):
    _well_formed(sp.parse("\n".join(lines)))


@pytest.mark.parametrize("log", [COLD, CPU], ids=lambda x: x.name)
def test_truncation_at_every_line_never_contradicts_the_full_log(log):
    """A start cut short (a server that died, a log read mid-start) reports a subset: every marker it
    finds is one the full log has, every gap it gives equals the full log's, and vLLM's own
    durations are never above the full log's (the largest over workers seen so far)."""
    full = sp.from_log_file(log)
    lines = log.read_bytes().split(b"\n")
    for n in range(len(lines) + 1):
        cut = sp.parse(b"\n".join(lines[:n]))
        _well_formed(cut)
        assert set(cut["found"]) <= set(full["found"]), n
        for k in GAPS + ("total_logged_s", "after_capture_s", "engine_init_s", "compile_s"):
            assert cut[k] is None or cut[k] == full[k], (n, k)
        for k in ("weights_s", "model_load_s", "graph_capture_s"):
            assert cut[k] is None or cut[k] <= full[k], (n, k)
    # and a cut inside a line (bytes, mid-UTF-8 too) never raises
    raw = log.read_bytes()
    for off in range(0, len(raw), 97):
        _well_formed(sp.parse(raw[:off]))


def test_pathological_long_lines_parse_in_linear_time():
    import time

    t = time.perf_counter()
    for junk in (
        "(" + " " * 200_000,
        "(Worker pid=1) INFO 11-29 10:00:00 [" + "a " * 100_000,
        "Model loading took 1 GiB" + " and x" * 40_000,
        "init engine (" + "(" * 100_000,
    ):
        _well_formed(sp.parse(junk))
    assert time.perf_counter() - t < 2.0  # a quadratic pattern takes minutes here
