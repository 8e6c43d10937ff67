"""`python -m kernels_check` / `python run_e2e.py kernels`: the kernel-level check, GPU required.

    python -m kernels_check [--quick] [--shapes 8/8,16/8,...] [--contexts 1024,...] [--dtypes bf16]
    python -m kernels_check --report results/kernels/<run-id>     (recompute summary, no GPU)

Exit status (e2e/exits.py, the rule of every entry point): 0 done (every row ok), 1 done with
failed or misrouted rows, 2 bad input, no GPU or a crash (traceback, then `error: internal error`),
130 interrupted (rows so far are kept).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from e2e.errors import UserError
from e2e.exits import guarded
from kernels_check import cells as C

DEFAULT_OUT = "results/kernels"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m kernels_check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"a few cells first: shapes {C.QUICK_SHAPES}, contexts "
        f"{','.join(map(str, C.QUICK_CONTEXTS))}, bf16 faults on 32/16 only",
    )
    p.add_argument("--shapes", help=f"Q/KV head counts (default {C.DEFAULT_SHAPES})")
    p.add_argument("--contexts", help=f"context lengths (default {','.join(map(str, C.DEFAULT_CONTEXTS))})")
    p.add_argument("--dtypes", default="bf16", help="bf16,fp16 (default: %(default)s)")
    p.add_argument("--batch", type=int, default=8, help="sequences per decode launch (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reps", type=int, default=50, help="timed L2-cold launches per path (default: %(default)s)")
    p.add_argument("--graph-inner", type=int, default=10, help="launches per captured CUDA graph")
    p.add_argument("--graph-reps", type=int, default=20, help="graph replays timed")
    p.add_argument("--flush-mib", type=int, default=1024, help="L2 flush buffer (default: %(default)s MiB)")
    p.add_argument("--no-timing", action="store_true", help="correctness and routing only")
    p.add_argument("--no-faults", action="store_true", help="skip the fault sweep")
    p.add_argument("--fault-dtypes", help="dtypes of the fault sweep (default bf16,fp16)")
    p.add_argument("--fault-shapes", help="shapes of the fault sweep (default: --shapes)")
    p.add_argument(
        "--fault-lengths",
        default="4096,4090",
        help="lengths that fill the final block exactly and that straddle it (default: %(default)s)",
    )
    p.add_argument("--fault-batch", type=int, default=4)
    p.add_argument("--out", default=DEFAULT_OUT, help="results root (default: %(default)s)")
    p.add_argument("--run-id", help="run folder name (default: time stamp)")
    p.add_argument("--report", metavar="RUN_DIR", help="recompute summary and figures of a run; no GPU")
    return p


def resolve(a: argparse.Namespace) -> C.Plan:
    """Validated sweep parameters from the arguments (pure; raises UserError)."""
    shapes = C.parse_shapes(a.shapes or (C.QUICK_SHAPES if a.quick else C.DEFAULT_SHAPES))
    contexts = (
        C.parse_ints(a.contexts, "--contexts")
        if a.contexts
        else list(C.QUICK_CONTEXTS if a.quick else C.DEFAULT_CONTEXTS)
    )
    dtypes = C.parse_dtypes(a.dtypes)
    fault_dtypes = C.parse_dtypes(a.fault_dtypes or ("bf16" if a.quick else "bf16,fp16"), "--fault-dtypes")
    fault_shapes = (
        C.parse_shapes(a.fault_shapes) if a.fault_shapes else ([C.parse_shapes("32/16")[0]] if a.quick else shapes)
    )
    fault_lengths = C.parse_ints(a.fault_lengths, "--fault-lengths")
    for name in ("batch", "reps", "graph_inner", "graph_reps", "fault_batch", "flush_mib"):
        if getattr(a, name) <= 0:
            raise UserError(f"--{name.replace('_', '-')} must be positive, got {getattr(a, name)}")
    return {
        "shapes": shapes,
        "contexts": contexts,
        "dtypes": dtypes,
        "fault_dtypes": fault_dtypes,
        "fault_shapes": fault_shapes,
        "fault_lengths": fault_lengths,
        "reps": a.reps if not a.quick or a.reps != 50 else 20,
    }


def require_gpu() -> None:
    """One line and exit 2 (via UserError) when there is no GPU to run kernels on."""
    from e2e import extras

    extras.require("kernels", "kernels_check (PyTorch with a GPU)")
    import torch

    if not torch.cuda.is_available():
        raise UserError(
            "kernels_check needs a CUDA or ROCm GPU: torch.cuda.is_available() is False "
            "on this machine (use --report RUN_DIR to summarise an existing run)"
        )


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    return guarded(_main, a)


def _main(a: argparse.Namespace) -> int:
    if a.report:
        from kernels_check.report import write_report

        print(write_report(Path(a.report)), end="")
        return 0
    plan = resolve(a)
    require_gpu()
    from kernels_check.run import run

    return run(a, plan)
