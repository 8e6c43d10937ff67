"""CPU tests of kernels_check: reference, paging, scoring, fault bookkeeping, report, CLI errors.

The GPU part (vLLM's dispatch, FA3, timing) runs on a GPU (`run_e2e.py kernels`); the whole run with
stand-in kernels is tests/unit/kernels_check/test_kernels_check_run.py. Here a small cache reader written in torch
(tests/support/kernel_standins.read_rocm) stands in for a kernel where a test needs a kernel's output:
it reads through vLLM's ROCm cache layout tile by tile, once with the K/V load mask (as vLLM 0.26.0's
kernel_paged_attention_2d does) and once without it (the defect vllm#53856 describes).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from e2e.errors import UserError
from kernels_check import cells, faults, paging, paths, report, scoring
from kernels_check.cli import main
from kernels_check.reference import reference_decode
from tests.support import ROOT
from tests.support.kernel_standins import read_rocm


def dense(seqs, max_len, q_heads, kv_heads, d, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(seqs, q_heads, d, generator=g).to(dtype)
    k = torch.randn(seqs, max_len, kv_heads, d, generator=g).to(dtype)
    v = torch.randn(seqs, max_len, kv_heads, d, generator=g).to(dtype)
    return q, k, v


def naive_f64(q, k, v, seq_lens, scale):
    """Attention written out head by head in float64: the reference's own reference."""
    seqs, qh, d = q.shape
    kvh = k.shape[2]
    out = torch.empty(seqs, qh, d, dtype=torch.float64)
    for s in range(seqs):
        for h in range(qh):
            g = h // (qh // kvh)
            kk = k[s, : seq_lens[s], g].double()
            sc = (kk @ q[s, h].double()) * scale
            w = torch.exp(sc - sc.max())
            out[s, h] = (w / w.sum()) @ v[s, : seq_lens[s], g].double()
    return out


# -- reference -----------------------------------------------------------------------------------
@pytest.mark.parametrize("qh,kvh", [(4, 4), (6, 2), (8, 2), (6, 3)])
def test_reference_matches_float64_attention(qh, kvh):
    seq_lens = [37, 64, 5]
    q, k, v = dense(3, 64, qh, kvh, 32, dtype=torch.float32)
    got = reference_decode(q, k, v, seq_lens, 32**-0.5)
    want = naive_f64(q, k, v, seq_lens, 32**-0.5)
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-6)


def test_reference_ignores_positions_past_seq_len():
    q, k, v = dense(2, 40, 4, 2, 16, dtype=torch.float32)
    k[0, 30:] = math.nan
    v[0, 30:] = math.nan
    out = reference_decode(q, k, v, [30, 40], 0.25)
    assert torch.isfinite(out).all()
    assert torch.allclose(out[0].double(), naive_f64(q[:1], k[:1], v[:1], [30], 0.25)[0], atol=1e-6)


# -- paging --------------------------------------------------------------------------------------
def test_block_table_is_a_permutation_without_the_null_block():
    lens = [33, 16, 1, 47]
    bt, n = paging.make_block_table(lens, 16, spare_blocks=3, generator=torch.Generator().manual_seed(1))
    assert bt.dtype == torch.int32 and bt.shape == (4, 3)
    assert n == 1 + (3 + 1 + 1 + 3) + 3
    used = [int(b) for s, L in enumerate(lens) for b in bt[s, : math.ceil(L / 16)]]
    assert 0 not in used and len(set(used)) == len(used) and max(used) < n
    assert int(bt[1, 1]) == 0 and int(bt[2, 1:].abs().sum()) == 0  # padding is block 0
    assert used != sorted(used)  # physical order is shuffled


@pytest.mark.parametrize("dtype,x", [(torch.bfloat16, 8), (torch.float16, 8), (torch.float32, 4)])
def test_rocm_round_trip_with_partial_final_blocks(dtype, x):
    lens = [33, 16, 1, 47]
    q, k, v = dense(4, 47, 4, 2, 32, dtype=dtype)
    bt, n = paging.make_block_table(lens, 16, generator=torch.Generator().manual_seed(2))
    kc, vc = paging.page_rocm(k, v, lens, bt, n, 16, fill_k=-7.0, fill_v=-9.0)
    assert kc.shape == (n, 2, 32 // x, 16, x) and vc.shape == (n, 2, 32, 16)
    assert kc.stride(0) == kc.shape[1:].numel() and vc.stride(0) == vc.shape[1:].numel()
    ku, vu = paging.unpage_rocm(kc, vc, lens, bt)
    for s, L in enumerate(lens):
        assert torch.equal(ku[s, :L], k[s, :L]) and torch.equal(vu[s, :L], v[s, :L])
        assert not ku[s, L:].any()
    # Explicit addressing, independent of the implementation: token 40 of seq 3, head 1, dim 13.
    p, o = int(bt[3, 40 // 16]), 40 % 16
    assert kc[p, 1, 13 // x, o, 13 % x] == k[3, 40, 1, 13]
    assert vc[p, 1, 13, o] == v[3, 40, 1, 13]
    # The final block's tail keeps the fill: seq 0 has 33 tokens, so block 2 holds 1 and 15 unwritten.
    tail = int(bt[0, 2])
    assert (kc[tail, :, :, 1:, :] == -7.0).all() and (vc[tail, :, :, 1:] == -9.0).all()
    assert (kc[0] == -7.0).all()  # the null block is never written


def test_fa_round_trip_and_packed_layout():
    lens = [33, 47]
    q, k, v = dense(2, 47, 4, 2, 32)
    bt, n = paging.make_block_table(lens, 16, generator=torch.Generator().manual_seed(3))
    kc, vc = paging.page_fa(k, v, lens, bt, n, 16, fill_k=math.nan, fill_v=5.0)
    assert kc.shape == (n, 16, 2, 32) and kc.stride() == (16 * 2 * 64, 2 * 64, 64, 1)
    assert vc.data_ptr() == kc.data_ptr() + 32 * kc.element_size()  # K and V share each row
    p, o = int(bt[1, 46 // 16]), 46 % 16
    assert kc[p, o, 1, 3] == k[1, 46, 1, 3] and vc[p, o, 0, 31] == v[1, 46, 0, 31]
    ku, vu = paging.unpage_fa(kc, vc, lens, bt)
    for s, L in enumerate(lens):
        assert torch.equal(ku[s, :L], k[s, :L]) and torch.equal(vu[s, :L], v[s, :L])
    assert torch.isnan(kc[int(bt[0, 2]), 1:]).all() and (vc[int(bt[0, 2]), 1:] == 5.0).all()


def test_rocm_views_match_vllm_split_kv_cache():
    pa = pytest.importorskip("vllm.v1.attention.ops.paged_attn")  # vLLM on this machine (CPU build)
    kv = torch.empty(2, 5, 16 * 4 * 64, dtype=torch.bfloat16)
    for mine, theirs in zip(paging.rocm_views(kv, 4, 64), pa.PagedAttention.split_kv_cache(kv, 4, 64)):
        assert mine.shape == theirs.shape and mine.stride() == theirs.stride()
        assert mine.data_ptr() == theirs.data_ptr()


# -- scoring -------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_poison_is_detected_and_told_apart_from_kernel_nan(dtype):
    ref = torch.randn(3, 4, 8)
    out = torch.empty(3, 4, 8, dtype=dtype)
    scoring.poison_output(out)
    assert scoring.unwritten_mask(out).all() and torch.isnan(out).all()
    out[:2] = ref[:2].to(dtype)
    s = scoring.score(out, ref)
    assert s.status == "unwritten" and s.n_unwritten == 32 and s.n_nan == 0
    out[2] = ref[2].to(dtype)
    out[2, 1, 5] = math.nan  # a NaN the kernel produced: canonical payload
    s = scoring.score(out, ref)
    assert s.status == "nonfinite" and s.n_nan == 1 and s.n_unwritten == 0
    assert s.rel_linf is not None and s.rel_linf < scoring.tolerance(dtype)


def test_relative_linf_against_the_reference_scale():
    ref = torch.tensor([[0.5, -2.0], [1.0, 0.25]])
    out = ref.clone()
    out[1, 1] += 0.01
    s = scoring.score(out, ref, tol=1e-3)
    assert s.rel_linf == pytest.approx(0.01 / 2.0) and s.ref_scale == 2.0
    assert s.status == "over_tolerance" and s.faulted
    assert scoring.score(ref.clone(), ref).status == "ok"
    with pytest.raises(ValueError):
        scoring.score(ref[:1], ref)


def test_bf16_rounding_alone_stays_under_tolerance():
    ref = torch.randn(8, 16, 128) * 0.03
    s = scoring.score(ref.to(torch.bfloat16), ref)
    assert s.status == "ok" and 0 < s.rel_linf < scoring.tolerance(torch.bfloat16) / 2


# -- fault bookkeeping ---------------------------------------------------------------------------
def test_tail_slots_for_exact_and_straddling_lengths():
    assert faults.tail_slots(4096, 16) == 0
    assert faults.tail_slots(4090, 16) == 6
    assert faults.tail_slots(1, 16) == 15


@pytest.mark.parametrize("mode,want", [("none", (0.0, 0.0)), ("k", ("x", 0.0)), ("v", (0.0, "x")), ("kv", ("x", "x"))])
def test_fills_put_the_fault_only_in_the_chosen_cache(mode, want):
    got = faults.fills(mode, "large")
    assert got == tuple(faults.VALUES["large"] if w == "x" else w for w in want)
    fk, fv = faults.fills(mode, "nan")
    assert math.isnan(fk) == (mode in ("k", "kv")) and math.isnan(fv) == (mode in ("v", "kv"))
    with pytest.raises(ValueError):
        faults.fills("q", "nan")


def test_tail_bookkeeping_counts_the_slots_that_keep_the_fault():
    lens = [4096, 4090]
    bt, n = paging.make_block_table(lens, 16, spare_blocks=4, generator=torch.Generator().manual_seed(0))
    b = faults.tail_bookkeeping(lens, bt, n, 16)
    assert b.tail_slots_per_seq == [0, 6]
    assert b.poisoned_in_table == 6
    assert b.poisoned_outside_table == (1 + 4) * 16  # null block and spares
    # The bookkeeping agrees with what paging leaves behind in the cache itself.
    q, k, v = dense(2, 4096, 2, 1, 16)
    kc, vc = paging.page_rocm(k, v, lens, bt, n, 16, fill_k=math.nan, fill_v=0.0)
    nan_slots = torch.isnan(kc).permute(0, 3, 1, 2, 4).reshape(n, 16, -1).all(-1)
    assert torch.equal(nan_slots, ~faults.written_mask(lens, bt, n, 16))


@pytest.mark.parametrize("value", ["nan", "large"])
def test_fault_pattern_from_a_reader_without_the_load_mask(value):
    """At 4090 (six unwritten slots) a reader that consumes the whole final block is poisoned by a
    NaN in V, never by K alone (the score mask covers K), and not by finite garbage; at 4096 it is
    clean. The masked reader is clean everywhere. Controls are flagged for both."""
    q, k, v = dense(1, 4096, 4, 2, 16, seed=5)
    scale = 0.25
    seen = {}
    for L in (4096, 4090):
        ref = reference_decode(q, k, v, [L], scale)
        bt, n = paging.make_block_table([L], 16, generator=torch.Generator().manual_seed(L))
        for mode in faults.MODES:
            fk, fv = faults.fills(mode, value)
            kc, vc = paging.page_rocm(k, v, [L], bt, n, 16, fk, fv)
            for masked in (True, False):
                out = read_rocm(q, kc, vc, bt, [L], scale, load_mask=masked)
                seen[(L, mode, masked)] = scoring.score(out, ref).status
        for which, val in faults.CONTROLS:
            kc, vc = paging.page_rocm(k, v, [L], bt, n, 16)
            faults.inject_written("rocm", kc, vc, bt, 0, L - 1, 0, which, faults.control_vector(which, val, q[0, 0]))
            for masked in (True, False):
                out = read_rocm(q, kc, vc, bt, [L], scale, load_mask=masked)
                assert scoring.score(out, ref).faulted, (L, which, val, masked)
    assert all(st == "ok" for (L, mode, masked), st in seen.items() if masked)
    unmasked_bad = {(L, mode) for (L, mode, masked), st in seen.items() if not masked and st != "ok"}
    if value == "nan":
        assert unmasked_bad == {(4090, "v"), (4090, "kv")}
    else:
        assert unmasked_bad == set()


def test_inject_written_hits_the_same_token_in_both_layouts():
    lens = [40]
    q, k, v = dense(1, 40, 2, 2, 16)
    bt, n = paging.make_block_table(lens, 16, generator=torch.Generator().manual_seed(9))
    rk, rv = paging.page_rocm(k, v, lens, bt, n, 16)
    fk, fv = paging.page_fa(k, v, lens, bt, n, 16)
    vec = torch.arange(16, dtype=torch.bfloat16)
    for layout, (kc, vc) in (("rocm", (rk, rv)), ("fa", (fk, fv))):
        faults.inject_written(layout, kc, vc, bt, 0, 39, 1, "k", vec)
        faults.inject_written(layout, kc, vc, bt, 0, 20, 0, "v", -vec)
    for ku, vu in (paging.unpage_rocm(rk, rv, lens, bt), paging.unpage_fa(fk, fv, lens, bt)):
        assert torch.equal(ku[0, 39, 1], vec) and torch.equal(vu[0, 20, 0], -vec)
        assert torch.equal(ku[0, 39, 0], k[0, 39, 0])  # the other head is untouched


# -- op counting ---------------------------------------------------------------------------------
def test_op_counter_counts_kernel_launches_and_calls_and_restores():
    calls = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda **kw: calls.append((grid, kw))

    class Mod:
        kernel_paged_attention_2d = Kernel()
        context_attention_fwd = staticmethod(lambda **kw: None)

    class Ops:
        paged_attention_rocm = staticmethod(lambda *a: "rocm")

    originals = (Mod.kernel_paged_attention_2d, Mod.context_attention_fwd, Ops.paged_attention_rocm)
    c = paths.OpCounter()
    c.install(Mod, Ops)
    with c.delta() as d:
        Mod.kernel_paged_attention_2d[(2, 3)](a=1)
        Mod.kernel_paged_attention_2d[(2, 3)](a=2)
        assert Ops.paged_attention_rocm(1) == "rocm"
    assert d == {"triton_2d": 2, "rocm_custom": 1, "prefill": 0}
    assert calls == [((2, 3), {"a": 1}), ((2, 3), {"a": 2})]
    c.uninstall()
    assert (Mod.kernel_paged_attention_2d, Mod.context_attention_fwd, Ops.paged_attention_rocm) == originals


# -- CLI and report ------------------------------------------------------------------------------
def test_no_gpu_is_one_line_and_exit_2():
    r = subprocess.run(
        [sys.executable, "-m", "kernels_check", "--quick"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "needs a CUDA or ROCm GPU" in r.stderr


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["--shapes", "32/12"], "multiple of kv heads"),
        (["--contexts", "1k"], "--contexts"),
        (["--dtypes", "fp8"], "fp8"),
        (["--batch", "0"], "--batch"),
    ],
)
def test_bad_arguments_exit_2(argv, msg, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and msg in err


def test_quick_plan_is_small_and_default_plan_is_the_issue_sweep():
    from kernels_check.cli import build_parser, resolve

    full = resolve(build_parser().parse_args([]))
    assert [s.name for s in full["shapes"]] == ["8/8", "16/8", "24/8", "32/8", "32/16"]
    assert [s.ratio for s in full["shapes"]] == [1, 2, 3, 4, 2]
    assert full["contexts"] == [1024, 2048, 4096, 8192, 16384, 32768]
    assert full["fault_lengths"] == [4096, 4090] and full["fault_dtypes"] == ["bf16", "fp16"]
    quick = resolve(build_parser().parse_args(["--quick"]))
    n_quick = len(cells.sweep_cells(quick["shapes"], quick["contexts"], quick["dtypes"], 0))
    assert n_quick == 4 and len(cells.sweep_cells(full["shapes"], full["contexts"], full["dtypes"], 0)) == 30


def _row(**kw):
    return {"schema_version": 1, **kw}


def test_report_recomputes_table_figures_and_fault_pattern(tmp_path):
    s = cells.Shape(32, 16).to_dict()
    rows = []
    for ctx, t, f in ((1024, 0.20, 0.05), (8192, 1.6, 0.2)):
        for p, ms, err in (("triton", t, 2e-3), ("fa3", f, 1e-3)):
            rows.append(
                _row(
                    kind="cell",
                    dtype="bf16",
                    shape=s,
                    context=ctx,
                    batch=8,
                    path=p,
                    status="ok",
                    routed_as_expected=True,
                    time_cold={"median_ms": ms, "n": 5},
                    score={"status": "ok", "rel_linf": err},
                )
            )
    for L, tail in ((4096, 0), (4090, 6)):
        for p in ("triton", "fa3"):
            for mode in ("none", "v"):
                bad = p == "fa3" and mode == "v" and L == 4090
                rows.append(
                    _row(
                        kind="fault",
                        dtype="bf16",
                        shape=s,
                        length=L,
                        tail_slots=tail,
                        mode=mode,
                        value="nan" if mode != "none" else None,
                        path=p,
                        status="ok",
                        faulted=bad,
                        score={
                            "status": "nonfinite" if bad else "ok",
                            "n_nan": 128 if bad else 0,
                            "n_inf": 0,
                            "rel_linf": 1e-3,
                        },
                    )
                )
            rows.append(
                _row(
                    kind="fault_control",
                    dtype="bf16",
                    shape=s,
                    length=L,
                    path=p,
                    status="ok",
                    faulted=p == "triton" or L == 4096,
                    score={"status": "nonfinite"},
                )
            )
    rows.append(
        _row(
            kind="cell",
            dtype="bf16",
            shape=s,
            context=32768,
            batch=8,
            path="triton",
            status="failed",
            error="OutOfMemoryError: x",
        )
    )
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "manifest.json").write_text(
        json.dumps({"run_id": "t", "rocm_custom": {"available": False}, "gpu": {"name": "NVIDIA H200"}})
    )
    assert main(["--report", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    ratios = {c["context"]: c["ratio_triton_over_other"] for c in summary["cells"]}
    assert ratios[1024] == pytest.approx(4.0) and ratios[8192] == pytest.approx(8.0) and ratios[32768] is None
    assert summary["controls"] == {
        "triton": {"ran": 2, "flagged": 2, "failed": 0},
        "fa3": {"ran": 2, "flagged": 1, "failed": 0},
    }
    pattern = {(f["length"], f["mode"]): (f["triton"], f["fa3"]) for f in summary["faults"]}
    assert pattern[(4090, "v")] == ("clean", "NaN/inf x128") and pattern[(4096, "v")] == ("clean", "clean")
    md = (tmp_path / "summary.md").read_text()
    assert "NOT available on this machine" in md and "fa3: 1 of 2 tail-fault rows changed the output" in md
    assert md.rstrip().splitlines()[-1].startswith("fa3 relative L-inf error")  # the cell table comes last
    assert (tmp_path / "fig_time_ratio.png").stat().st_size > 0
    assert (tmp_path / "fig_error_vs_depth.png").stat().st_size > 0


def test_report_refuses_a_folder_without_rows(tmp_path):
    assert main(["--report", str(tmp_path)]) == 2
    with pytest.raises(UserError):
        report.read_rows(tmp_path)


KERNEL_RUNS = sorted(p.parent for p in (ROOT / "results" / "kernels").glob("*/rows.jsonl"))


@pytest.mark.parametrize("run", KERNEL_RUNS, ids=[p.name for p in KERNEL_RUNS])
def test_a_committed_kernels_summary_re_renders_from_its_rows(run, tmp_path):
    """summary.md and summary.json are what `--report` computes from the committed rows now."""
    import shutil

    copy = tmp_path / run.name
    shutil.copytree(run, copy)
    report.write_report(copy)
    assert (copy / "summary.md").read_text() == (run / "summary.md").read_text()
    assert json.loads((copy / "summary.json").read_text()) == json.loads((run / "summary.json").read_text())
