"""The GPU run, end to end: environment checks, manifest, routing probes, sweep, faults, report."""

from __future__ import annotations

import argparse
import importlib.metadata as md
import sys
import time
from pathlib import Path
from typing import Any

import torch

from e2e.rundir import manifest as mf
from e2e.rundir.store import KERNEL_ROWS, RunStore, read_jsonl
from kernels_check import paths, report
from kernels_check.cells import Plan, sweep_cells
from kernels_check.kit import Kit, gpu_kit
from kernels_check.reference import full_fp32_matmul
from kernels_check.sweep import (
    TORCH_DTYPE,
    Ctx,
    Settings,
    rocm_custom_launches,
    routing_probes,
    run_cell,
    run_fault_group,
    settings_dict,
)


def _versions() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for d in ("vllm", "torch", "triton"):
        try:
            out[d] = md.version(d)
        except md.PackageNotFoundError:
            pass
    import vllm

    out["vllm_imported"] = vllm.__version__  # PYTHONPATH installs may lack dist metadata
    out["vllm_path"] = str(Path(vllm.__file__).parent)
    out["cuda"] = torch.version.cuda
    out["hip"] = getattr(torch.version, "hip", None)
    out["python"] = sys.version.split()[0]
    return out


def _available(kit: Kit, plan: Plan) -> tuple[list[str], str | None, dict[str, dict[str, Any]]]:
    """The paths every cell runs, the comparator of Triton, and why each non-Triton path is there or not."""
    registered, rocm_why = kit.rocm_op()
    rocm_ok = False
    if registered:  # launch it once before calling it available
        rocm_ok, rocm_why = rocm_custom_launches(kit, plan["shapes"][0], plan["dtypes"][0])
    fa3_ok, fa3_why = kit.fa3() if not kit.rocm_build else (False, "ROCm build")
    run_paths = ["triton"] + (["rocm_custom"] if rocm_ok else []) + (["fa3"] if fa3_ok else [])
    comparator = "rocm_custom" if rocm_ok else ("fa3" if fa3_ok else None)
    why = {
        "rocm_custom": {"available": rocm_ok, "registered": registered, "reason": rocm_why},
        "fa3": {"available": fa3_ok, "reason": fa3_why},
    }
    return run_paths, comparator, why


def _settings(a: argparse.Namespace, plan: Plan) -> Settings:
    return Settings(
        batch=a.batch,
        reps=plan["reps"],
        graph_inner=a.graph_inner,
        graph_reps=a.graph_reps,
        flush_mib=a.flush_mib,
        timing=not a.no_timing,
        fault_batch=a.fault_batch,
    )


def _manifest(
    a: argparse.Namespace,
    plan: Plan,
    run_id: str,
    settings: Settings,
    kit: Kit,
    native: dict[str, bool],
    available: tuple[list[str], str | None, dict[str, dict[str, Any]]],
) -> dict[str, Any]:
    shapes, dtypes = plan["shapes"], plan["dtypes"]
    run_paths, comparator, why = available
    layout = paths.layout_check(
        TORCH_DTYPE[dtypes[0]], shapes[0].kv_heads, shapes[0].head_size, shapes[0].block_size, kit.device
    )
    manifest = {
        "schema_version": report.SCHEMA_VERSION,
        "tool": "kernels_check",
        "run_id": run_id,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "ended": None,
        "status": "running",
        "argv": sys.argv,
        "quick": a.quick,
        "seed": a.seed,
        "settings": settings_dict(settings),
        "plan": {
            "shapes": [s.to_dict() for s in shapes],
            "contexts": plan["contexts"],
            "dtypes": dtypes,
            "fault_dtypes": plan["fault_dtypes"],
            "fault_shapes": [s.to_dict() for s in plan["fault_shapes"]],
            "fault_lengths": plan["fault_lengths"],
            "faults": not a.no_faults,
        },
        "versions": _versions(),
        "gpu": kit.describe(),
        "host": mf.host(),
        "git": mf.git_commit(mf.project_root()),
        "environment": mf.relevant_env(),
        "dispatch": f"{paths.DISPATCH_MODULE}.chunked_prefill_paged_decode{kit.v.dispatch_signature}",
        "native_gate": native,
        **why,
        "paths": run_paths,
        "comparator": comparator,
        "layout_check": layout,
        "tf32": "disabled for the fp32 reference",
        "scale": "head_size ** -0.5 for every shape",
    }
    manifest["statement"] = report.statement(manifest, comparator)
    return manifest


def _sweep(ctx: Ctx, plan: Plan, seed: int, faults: bool) -> None:
    """Routing probes (gate off), the timed cells, the fault groups, routing probes (gate on)."""
    shapes, dtypes = plan["shapes"], plan["dtypes"]
    routing_probes(ctx, shapes, dtypes[0], seed, states=(False,))
    for cell in sweep_cells(shapes, plan["contexts"], dtypes, seed):
        run_cell(ctx, cell)
    if faults:
        ctx.flush = None  # the fault sweep runs untimed: its memory goes to the faulted caches
        ctx.kit.empty_cache()
        i = 0
        for d in plan["fault_dtypes"]:
            for s in plan["fault_shapes"]:
                for n in plan["fault_lengths"]:
                    run_fault_group(ctx, d, s, n, seed + 50_000 + i)
                    i += 1
    routing_probes(ctx, shapes, dtypes[0], seed, states=(True,))  # last: see routing_probes


def run(a: argparse.Namespace, plan: Plan, kit: Kit | None = None) -> int:
    """The run; `kit` is the machine (kit.gpu_kit() when None; tests pass CPU stand-ins)."""
    kit = kit or gpu_kit()
    v = kit.v
    paths.patch_mechanism()  # fail now, not after the run folder exists
    full_fp32_matmul()
    # The gate's own answers, before any patch touches it.
    native = {
        f"{d}:{s.name}": paths.native_gate(v, TORCH_DTYPE[d], s.head_size, s.block_size, s.ratio, max(plan["contexts"]))
        for d in plan["dtypes"]
        for s in plan["shapes"]
    }
    available = _available(kit, plan)
    run_id = a.run_id or time.strftime("%Y%m%d-%H%M%S")
    root = Path(a.out) / run_id
    settings = _settings(a, plan)
    store = RunStore.create(root)
    with store:
        manifest = _manifest(a, plan, run_id, settings, kit, native, available)
        store.write_manifest(manifest)
        counter = paths.OpCounter()
        counter.install(v.dispatch_mod, v.custom_ops)
        flush = torch.empty(settings.flush_mib * 2**20, dtype=torch.uint8, device=kit.device)
        ctx = Ctx(kit, counter, settings, store, available[0], flush)
        del flush  # ctx holds the one reference: the fault sweep frees it
        ctx.say(f"run folder: {root}")
        ctx.say(manifest["statement"])
        rocm = available[2]["rocm_custom"]
        if rocm["registered"] and not rocm["available"]:  # the op is here but cannot run: say why, once
            ctx.say(f"ROCm custom kernel: {rocm['reason']}")
        ctx.say(f"layouts: {manifest['layout_check']}")
        t0 = time.monotonic()
        status, bad = "crashed", []
        try:
            _sweep(ctx, plan, a.seed, not a.no_faults)
            status = "complete"
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        finally:
            counter.uninstall()
            rows = read_jsonl(root / KERNEL_ROWS)
            bad = [r for r in rows if r.get("status") in ("failed", "misrouted")]
            store.update_manifest(
                ended=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                wall_s=round(time.monotonic() - t0, 1),
                status=status + ("-with-failures" if bad else ""),
                n_rows=len(rows),
                n_bad_rows=len(bad),
            )
        md_text = report.write_report(root)
        print(md_text, end="")
        print(f"\nrows, manifest, summary.md/json and figures: {root}")
        return 1 if bad else 0
