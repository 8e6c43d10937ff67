"""The GPU run: routing probes, the timed sweep, the fault sweep. One failure is a row, not a stop.

Every row is appended (and fsynced) to rows.jsonl as soon as it exists; report.py recomputes the
summary and figures from those rows alone.
"""

from __future__ import annotations

import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from e2e.report.tables import num
from e2e.rundir.store import KERNEL_ROWS, RunStore
from kernels_check import faults, paths, scoring, timing
from kernels_check.cells import Cell, Shape
from kernels_check.kit import Kit
from kernels_check.paging import make_block_table, page_fa, page_rocm, unpage_rocm
from kernels_check.paths import Vllm
from kernels_check.reference import reference_decode

TORCH_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class Settings:
    batch: int = 8
    reps: int = 50
    graph_inner: int = 10
    graph_reps: int = 20
    flush_mib: int = 1024
    timing: bool = True
    fault_batch: int = 4
    spare_blocks: int = 4


@dataclass
class Ctx:
    kit: Kit
    counter: paths.OpCounter
    settings: Settings
    store: RunStore
    paths: list[str]  # the paths run in every cell, e.g. ["triton", "fa3"]
    flush: torch.Tensor | None = None
    log: Any = field(default_factory=lambda: sys.stderr)  # the stderr of the moment, not of the import

    @property
    def v(self) -> Vllm:
        return self.kit.v

    @property
    def device(self) -> torch.device:
        return self.kit.device

    def emit(self, row: dict[str, Any]) -> None:
        self.store.append(KERNEL_ROWS, row)

    def say(self, msg: str) -> None:
        print(msg, file=self.log, flush=True)


def _err(exc: BaseException) -> dict[str, Any]:
    tb = traceback.format_exc().strip().splitlines()
    return {
        "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500],
        "traceback_tail": tb[-8:],
    }


# -- inputs --------------------------------------------------------------------------------------
def make_dense(
    shape: Shape, dtype: str, seq_lens: list[int], seed: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fresh N(0, 1) q, k, v in the cell's dtype (never zeros); k, v dense [seqs, max_len, kv, head]."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    dt = TORCH_DTYPE[dtype]
    n = len(seq_lens)
    q = torch.randn(n, shape.q_heads, shape.head_size, generator=g, device=device, dtype=dt)
    k = torch.randn(n, max(seq_lens), shape.kv_heads, shape.head_size, generator=g, device=device, dtype=dt)
    v = torch.randn(n, max(seq_lens), shape.kv_heads, shape.head_size, generator=g, device=device, dtype=dt)
    return q, k, v


def build_inputs(
    shape: Shape,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    seq_lens: list[int],
    block_table_cpu: torch.Tensor,
    num_blocks: int,
    fill_k: float,
    fill_v: float,
    with_fa: bool,
    device: torch.device,
) -> paths.DecodeInputs:
    b = shape.block_size
    kc, vc = page_rocm(k, v, seq_lens, block_table_cpu, num_blocks, b, fill_k, fill_v)
    fk = fv = None
    if with_fa:
        fk, fv = page_fa(k, v, seq_lens, block_table_cpu, num_blocks, b, fill_k, fill_v)
    idx = torch.arange(len(seq_lens), device=device)
    last = torch.tensor([n - 1 for n in seq_lens], device=device)
    return paths.DecodeInputs(
        query=q,
        key=k[idx, last].contiguous(),
        value=v[idx, last].contiguous(),
        key_cache=kc,
        value_cache=vc,
        block_table=block_table_cpu.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=torch.arange(len(seq_lens) + 1, dtype=torch.int32, device=device),
        max_seq_len=max(seq_lens),
        scale=shape.head_size**-0.5,
        k_scale=torch.ones((), dtype=torch.float32, device=device),
        v_scale=torch.ones((), dtype=torch.float32, device=device),
        fa_key_cache=fk,
        fa_value_cache=fv,
    )


# -- one path on one set of inputs ---------------------------------------------------------------
def run_path(
    ctx: Ctx, path: str, x: paths.DecodeInputs, ref: torch.Tensor, shape: Shape, dtype: str, time_it: bool
) -> dict[str, Any]:
    """Launch once (output poisoned first), score, check routing; then time if asked."""
    row: dict[str, Any] = {"path": path}
    out = torch.empty_like(x.query)
    scoring.poison_output(out)
    probe = (TORCH_DTYPE[dtype], shape.head_size, shape.block_size, shape.ratio, x.max_seq_len)
    if path in paths.EXPECTED_COUNTS:
        row["gate_forced"] = path == "rocm_custom"
        row["patches_applied"] = paths.force_gate(ctx.v, path == "rocm_custom", probe)
        launch = paths.dispatch_launch(ctx.v, x, out)
    elif path == "fa3":
        launch = paths.fa3_launch(ctx.kit.fa3_varlen(), x, out)
    else:
        raise ValueError(f"unknown path {path!r}")
    with ctx.counter.delta() as counts:
        launch()
        ctx.kit.synchronize()
    expected = paths.EXPECTED_COUNTS.get(path, {"triton_2d": 0, "rocm_custom": 0, "prefill": 0})
    row["counts"] = counts
    row["routed_as_expected"] = counts == expected
    row["score"] = scoring.score(out, ref).to_dict()
    if time_it:
        if ctx.flush is None:
            raise RuntimeError("no L2 flush buffer: timed launches run before the fault sweep frees it")
        row["time_cold"] = timing.summarize(ctx.kit.time_cold(launch, ctx.settings.reps, ctx.flush))
        try:
            row["time_graph"] = timing.summarize(
                ctx.kit.time_graph(launch, ctx.settings.graph_inner, ctx.settings.graph_reps)
            )
        except Exception as exc:  # capture can fail for reasons unrelated to the kernel
            row["time_graph"] = {"n": 0, "error": f"{type(exc).__name__}: {exc}"[:300]}
            ctx.kit.synchronize()
    return row


# -- routing probes ------------------------------------------------------------------------------
def routing_probes(
    ctx: Ctx, shapes: list[Shape], dtype: str, seed: int, states: tuple[bool, ...] = (False, True)
) -> None:
    """Per shape: the gate forced on, then off, through the dispatch; what was counted. On a
    machine without the ROCm op the forced-on call reaches paged_attention_rocm and raises there:
    the count still proves the patch steers the dispatch. run.py probes "off" first and "on" last
    (the forced answers replace each other freely: e2e.plugin.patches)."""
    for i, shape in enumerate(shapes):
        seq_lens = [shape.block_size * 8] * 2
        q, k, v = make_dense(shape, dtype, seq_lens, seed + 10_000 + i, ctx.device)
        bt, nb = make_block_table(
            seq_lens, shape.block_size, ctx.settings.spare_blocks, torch.Generator().manual_seed(seed + i)
        )
        x = build_inputs(shape, q, k, v, seq_lens, bt, nb, 0.0, 0.0, False, ctx.device)
        probe = (TORCH_DTYPE[dtype], shape.head_size, shape.block_size, shape.ratio, x.max_seq_len)
        for on in states:
            row: dict[str, Any] = {"kind": "routing", "dtype": dtype, "shape": shape.to_dict(), "gate_forced": on}
            out = torch.empty_like(q)
            scoring.poison_output(out)
            with ctx.counter.delta() as counts:
                try:
                    row["patches_applied"] = paths.force_gate(ctx.v, on, probe)
                    paths.dispatch_launch(ctx.v, x, out)()
                    ctx.kit.synchronize()
                    row["raised"] = None
                except Exception as exc:
                    row["raised"] = f"{type(exc).__name__}: {exc}"[:300]
            row["counts"] = counts
            row["steered"] = counts == paths.EXPECTED_COUNTS["rocm_custom" if on else "triton"]
            ctx.emit(row)
            ctx.say(
                f"routing {shape.name} gate {'on ' if on else 'off'}: {counts}"
                + (f" (raised {row['raised'][:80]})" if row["raised"] else "")
            )


# -- the ROCm custom kernel: registered is not yet available ----------------------------------------
def rocm_custom_launches(kit: Kit, shape: Shape, dtype: str) -> tuple[bool, str]:
    """One tiny launch of the ROCm custom kernel through the dispatch (gate forced on, ops counted)
    before the run calls it available. A vLLM build without code for this GPU (its arch missing from
    the build's target list) registers the op and fails at launch: here that is one line in the
    manifest and on the console, and the sweep runs without the path, instead of a failed row per
    cell. The gate is left forced on; every row forces it again."""
    seq_lens = [2 * shape.block_size]
    counter = paths.OpCounter()
    try:
        q, k, v = make_dense(shape, dtype, seq_lens, 0, kit.device)
        bt, nb = make_block_table(seq_lens, shape.block_size, 1, torch.Generator().manual_seed(0))
        x = build_inputs(shape, q, k, v, seq_lens, bt, nb, 0.0, 0.0, False, kit.device)
        out = torch.empty_like(q)
        paths.force_gate(kit.v, True, (TORCH_DTYPE[dtype], shape.head_size, shape.block_size, shape.ratio, seq_lens[0]))
        counter.install(kit.v.dispatch_mod, kit.v.custom_ops)
        with counter.delta() as counts:
            paths.dispatch_launch(kit.v, x, out)()
            kit.synchronize()
    except Exception as exc:
        arch = _arch(kit)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return False, (
            f"the ROCm custom paged-attention op is registered but one tiny launch ({shape.name}, {dtype}) "
            f"raised {type(exc).__name__}: {first[:160]} (a vLLM build without code for {arch}?)"
        )
    finally:
        counter.uninstall()
    if counts != paths.EXPECTED_COUNTS["rocm_custom"]:
        return False, f"the gate forced on did not reach the ROCm custom op in one tiny launch (ops counted: {counts})"
    return True, "torch.ops._rocm_C.paged_attention is registered and one tiny launch ran"


def _arch(kit: Kit) -> str:
    try:
        return str(kit.describe().get("arch") or "this GPU")
    except Exception:
        return "this GPU"


# -- the timed sweep -----------------------------------------------------------------------------
def run_cell(ctx: Ctx, cell: Cell) -> None:
    s = ctx.settings
    base = {
        "kind": "cell",
        "cell_id": cell.cell_id,
        "index": cell.index,
        "dtype": cell.dtype,
        "shape": cell.shape.to_dict(),
        "context": cell.context,
        "batch": s.batch,
        "seed": cell.seed,
    }
    t0 = time.monotonic()
    try:
        seq_lens = [cell.context] * s.batch
        q, k, v = make_dense(cell.shape, cell.dtype, seq_lens, cell.seed, ctx.device)
        ref = reference_decode(q, k, v, seq_lens, cell.shape.head_size**-0.5)
        bt, nb = make_block_table(
            seq_lens, cell.shape.block_size, s.spare_blocks, torch.Generator().manual_seed(cell.seed)
        )
        x = build_inputs(cell.shape, q, k, v, seq_lens, bt, nb, 0.0, 0.0, "fa3" in ctx.paths, ctx.device)
        # The cache must hold exactly what the reference saw (a paging bug shows up here, not
        # as kernel error).
        ku, vu = unpage_rocm(x.key_cache, x.value_cache, seq_lens, bt)
        base["paging_round_trip"] = bool(torch.equal(ku, k) and torch.equal(vu, v))
        del k, v, ku, vu
    except Exception as exc:
        for p in ctx.paths:
            ctx.emit({**base, "path": p, "status": "failed", "stage": "setup", **_err(exc)})
        ctx.say(f"cell {cell.cell_id}: setup failed: {type(exc).__name__}: {exc}")
        ctx.kit.empty_cache()
        return
    parts = []
    for p in ctx.paths:
        try:
            row = {**base, **run_path(ctx, p, x, ref, cell.shape, cell.dtype, s.timing), "status": "ok"}
            if not row["routed_as_expected"]:
                row["status"] = "misrouted"
        except Exception as exc:
            row = {**base, "path": p, "status": "failed", "stage": "launch", **_err(exc)}
            try:
                ctx.kit.synchronize()
            except Exception:
                pass
        ctx.emit(row)
        sc = row.get("score", {})
        ms = row.get("time_cold", {}).get("median_ms")
        parts.append(
            f"{p} {row['status']} err {num(sc.get('rel_linf'), '{:.2e}')} {sc.get('status', '')}"
            + (f" {ms:.4f} ms" if ms is not None else "")
        )
    ctx.say(f"cell {cell.index:3d} {cell.cell_id}: " + "; ".join(parts) + f" ({time.monotonic() - t0:.1f} s)")
    del x, ref
    ctx.kit.empty_cache()


# -- the fault sweep -----------------------------------------------------------------------------
@dataclass
class FaultGroup:
    """One (dtype, shape, length) of the fault sweep: dense inputs, their reference, one block table."""

    dtype: str
    shape: Shape
    length: int
    base: dict[str, Any]  # what every row of the group carries
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    ref: torch.Tensor
    seq_lens: list[int]
    block_table: torch.Tensor
    num_blocks: int

    def inputs(self, ctx: Ctx, fill_k: float, fill_v: float) -> paths.DecodeInputs:
        """Fresh caches over the same tokens, every unwritten slot holding fill_k / fill_v."""
        return build_inputs(
            self.shape,
            self.q,
            self.k,
            self.v,
            self.seq_lens,
            self.block_table,
            self.num_blocks,
            fill_k,
            fill_v,
            "fa3" in ctx.paths,
            ctx.device,
        )


def _fault_row(ctx: Ctx, p: str, x: paths.DecodeInputs, g: FaultGroup, row: dict[str, Any]) -> str:
    """Run one path over a faulted cache, score it, emit the row; one letter for the log line:
    F = the output was poisoned, . = clean, x = the launch failed."""
    try:
        r = run_path(ctx, p, x, g.ref, g.shape, g.dtype, time_it=False)
        row.update(r, status="ok", faulted=r["score"]["status"] != "ok")
    except Exception as exc:
        row.update(path=p, status="failed", stage="launch", **_err(exc))
    ctx.emit(row)
    return "F" if row.get("faulted") else ("." if row["status"] == "ok" else "x")


def _setup_failed(ctx: Ctx, base: dict[str, Any], exc: BaseException, **what: Any) -> None:
    ctx.emit({**base, **what, "status": "failed", "stage": "setup", **_err(exc)})


def _tail_faults(ctx: Ctx, g: FaultGroup) -> list[str]:
    """Every (value, mode) fault in the unwritten tail of the final block, on every path."""
    seen = []
    for value in faults.VALUES:
        for mode in faults.MODES:
            if mode == "none" and value != "nan":
                continue  # the clean baseline once per group
            try:
                x = g.inputs(ctx, *faults.fills(mode, value))
            except Exception as exc:
                _setup_failed(ctx, g.base, exc, kind="fault", mode=mode, value=value)
                continue
            for p in ctx.paths:
                row = {**g.base, "kind": "fault", "mode": mode, "value": value if mode != "none" else None}
                seen.append(f"{p}:{mode}/{value}={_fault_row(ctx, p, x, g, row)}")
    return seen


def _fault_controls(ctx: Ctx, g: FaultGroup) -> list[str]:
    """A fault the kernel must read (the last written token of sequence 0): every one flagged."""
    seen = []
    token = g.length - 1
    for which, value in faults.CONTROLS:
        try:
            x = g.inputs(ctx, 0.0, 0.0)
            vec = faults.control_vector(which, value, g.q[0, 0])
            faults.inject_written("rocm", x.key_cache, x.value_cache, g.block_table, 0, token, 0, which, vec)
            if x.fa_key_cache is not None and x.fa_value_cache is not None:
                faults.inject_written("fa", x.fa_key_cache, x.fa_value_cache, g.block_table, 0, token, 0, which, vec)
        except Exception as exc:
            _setup_failed(ctx, g.base, exc, kind="fault_control", which=which, value=value)
            continue
        for p in ctx.paths:
            row = {
                **g.base,
                "kind": "fault_control",
                "which": which,
                "value": value,
                "slot": {"seq": 0, "token": token, "kv_head": 0},
            }
            seen.append(f"{p}:ctl-{which}/{value}={_fault_row(ctx, p, x, g, row)}")
    return seen


def run_fault_group(ctx: Ctx, dtype: str, shape: Shape, length: int, seed: int) -> None:
    """One (dtype, shape, length): fresh inputs; every (value, mode) tail fault on every path; then
    the written-slot controls that show the instrument can see a fault."""
    s = ctx.settings
    gid = f"{dtype}-q{shape.q_heads}kv{shape.kv_heads}-L{length}"
    base: dict[str, Any] = {
        "dtype": dtype,
        "shape": shape.to_dict(),
        "length": length,
        "group_id": gid,
        "batch": s.fault_batch,
        "seed": seed,
    }
    try:
        seq_lens = [length] * s.fault_batch
        q, k, v = make_dense(shape, dtype, seq_lens, seed, ctx.device)
        ref = reference_decode(q, k, v, seq_lens, shape.head_size**-0.5)
        bt, nb = make_block_table(seq_lens, shape.block_size, s.spare_blocks, torch.Generator().manual_seed(seed))
        book = faults.tail_bookkeeping(seq_lens, bt, nb, shape.block_size)
        base.update(
            tail_slots=book.tail_slots_per_seq[0],
            poisoned_in_table=book.poisoned_in_table,
            poisoned_outside_table=book.poisoned_outside_table,
        )
    except Exception as exc:
        _setup_failed(ctx, base, exc, kind="fault")
        return
    g = FaultGroup(dtype, shape, length, base, q, k, v, ref, seq_lens, bt, nb)
    seen = _tail_faults(ctx, g) + _fault_controls(ctx, g)
    ctx.say(f"faults {gid}: " + " ".join(seen))
    ctx.kit.empty_cache()


def settings_dict(s: Settings) -> dict[str, Any]:
    return asdict(s)
