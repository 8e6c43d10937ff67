"""Rows -> per-cell, per-arm and between-arm tables (the only source of report figures).

RunAnalysis computes from a RunRecord (e2e/analysis/run_folder.py: a run folder as read, or rows in
memory). Only request rows of a finished cell's recorded attempt count (store.counted_requests);
failed cells and planned cells with no row become warnings, never numbers. The reference arm is the
config's first arm; every other arm is compared against it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection
from pathlib import Path
from typing import Any, cast

import numpy as np

from e2e.analysis import comparisons, load, routing_table, run_folder, slots, stalls, startups, wall_clock
from e2e.analysis.estimator import bookends_under, choose_estimator
from e2e.analysis.manifest_facts import gpu_name
from e2e.analysis.run_folder import RunRecord
from e2e.design.point import Point
from e2e.errors import UserError
from e2e.gpu import bandwidth, roofline
from e2e.rundir import gpu_rows, patch_evidence
from e2e.rundir.store import counted_requests
from e2e.stats import bookends, estimate, planning, verdicts
from e2e.stats import cells as stats
from e2e.stats import variance_model as vm

Key = tuple[str, Point, int]  # (arm, point, pass)


class RunAnalysis:
    """Everything a report shows, computed once from one run (a folder, or a RunRecord)."""

    def __init__(
        self, run: RunRecord | Path | str, estimator: str | None = None, client_at: Collection[tuple[str, Point]] = ()
    ):
        """run: a run folder, read by run_folder.read, or a RunRecord already read or built in memory.
        estimator: force one everywhere; None: the config's stats.estimator rule. client_at: arm x
        points on the plain client estimate whatever the rule says (compare, where the other run is)."""
        record = run if isinstance(run, RunRecord) else run_folder.read(run)
        self.root, self.manifest, self.plan = record.root, record.manifest, record.plan
        self.config = record.config  # the config as run, typed (run_folder.RunRecord.config)
        self.status = record.status  # harness-died when nobody holds the folder
        self._settings(estimator)
        self.warnings: list[str] = list(record.warnings)
        # The rows arrive typed (formats.CellRowDict, RequestRowDict); the tables below keep them as dicts.
        requests = cast(list[dict[str, Any]], record.requests)
        self.cell_rows = _first_per_cell(cast(list[dict[str, Any]], record.cells), self.warnings)
        by_cell: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in counted_requests(list(self.cell_rows.values()), requests):
            by_cell[r["cell_id"]].append(r)
        kept, stalled, stall_notes = stalls.refuse_stalled(
            dict(by_cell), (self.n_long, self.n_short), self.min_effect_pct
        )
        by_cell = defaultdict(list, kept)
        self.warnings.extend(stall_notes)
        self.requests_of = kept  # cell id -> its counted request rows
        self._design()
        ok = {cid: c for cid, c in self.cell_rows.items() if c.get("status") == "ok" and cid not in stalled}
        for cid, c in self.cell_rows.items():
            if cid not in ok and cid not in stalled:
                what = "not measured" if c.get("status") == "skipped" else "cell failed"
                why = (c.get("error") or "no reason recorded").removeprefix(f"{what}: ")  # a skip says it already
                self.warnings.append(f"{cid}: {what} ({why}): left out")
        choice = choose_estimator(
            self.estimator_setting, ok, by_cell, self.n_long, self.n_short, self.min_effect_pct, client_at
        )
        self.estimator, self.estimator_note = choice.name, choice.note
        self.estimator_by_point = choice.rows()  # per arm and point: which estimator and why
        if choice.warning:
            self.warnings.append(choice.warning)
        self._cell_stats(ok, choice.cells)
        # a bookend tests the values its cells were decided on (the runner could only test the client's)
        self.cell_rows = bookends_under(self.cell_rows, requests, choice.estimator_of, self.n_long, self.n_short)
        self.bookends = bookends.server_flags(self.cell_rows.values())
        self.fit = vm.fit(
            [(a, d, self.server_of[(a, d, p)], cs) for (a, d, p), cs in self.cells.items()],
            extra=self._drift_variance(ok),
        )
        if self.fit is not None:
            self.warnings.extend(self.fit.warnings)
        self.missing = [c["cell_id"] for c in self.plan if c["cell_id"] not in self.cell_rows]
        if self.missing:
            self.warnings.append(f"{len(self.missing)} planned cell(s) not run: {', '.join(self.missing)}")
        self.comparisons = self._comparisons()
        self.agreement = self._agreement()
        self.roofline = self._roofline(record)
        self.slots, slot_warnings = slots.slot_table(self.cell_rows.values(), self.cells, self.alpha)
        self.warnings.extend(slot_warnings)

    def on_client(self) -> set[tuple[str, Point]]:
        """The arm x points estimated on the plain client estimate (the prefill guard, or the setting)."""
        return {(r["arm"], Point.of(r)) for r in self.estimator_by_point if r["estimator"] == estimate.CLIENT}

    def _settings(self, estimator: str | None) -> None:
        """The config's workload lengths and decision settings (the manifest keeps the config as run)."""
        wl, st = self.config.workload, self.config.stats
        if wl.long_tokens is None or wl.short_tokens is None:
            raise UserError(f"{self.root}/manifest.json: no config.workload.long_tokens/short_tokens")
        self.n_long, self.n_short = wl.long_tokens, wl.short_tokens
        self.alpha = float(st.alpha)
        self.min_effect_pct = float(st.min_effect_pct)
        self.estimator_setting: str = estimator or st.estimator
        self.target_mde_pct = float(st.target_mde_pct or 2 * self.min_effect_pct)
        self.shared_servers = self.config.server.mode == "per-arm-pass"
        self.bandwidth_override = st.gpu_bandwidth_gbps
        self.tp = self.config.server.tensor_parallel_size

    def _design(self) -> None:
        """Arms (the config's order, reference first), points and passes: planned or run."""
        arm_order = [a.name for a in self.config.arms]
        rows = list(self.plan) + list(self.cell_rows.values())
        seen_arms = {c["arm"] for c in rows}
        self.arms: list[str] = [a for a in arm_order if a in seen_arms] + sorted(seen_arms - set(arm_order))
        self.reference = self.arms[0] if self.arms else None
        self.points: list[Point] = sorted({Point.of(c) for c in rows})
        self.passes: list[int] = sorted({c["pass"] for c in rows})

    def _cell_stats(self, ok: dict[str, dict[str, Any]], chosen: dict[str, stats.CellStats]) -> None:
        """(arm, point, pass) -> CellStats (under its arm and point's estimator) for the finished cells,
        and the server (key and attempt) of each."""
        self.cells: dict[Key, stats.CellStats] = {}
        self.server_of: dict[Key, str] = {}
        for cid, c in ok.items():
            cs = chosen[cid]
            key = (c["arm"], Point.of(c), c["pass"])
            self.cells[key] = cs
            self.server_of[key] = f"{c.get('server_key') or cid}#{c.get('attempt')}"
            self.warnings.extend(f"{cid}: {w}" for w in cs.warnings)

    # -- tables -----------------------------------------------------------------------------
    def cell_table(self) -> list[dict[str, Any]]:
        """One row per cell in plan order: identity, status, the cell's statistics, routing summary."""
        out = []
        order = [c["cell_id"] for c in self.plan] + sorted(set(self.cell_rows) - {c["cell_id"] for c in self.plan})
        for cid in order:
            c = self.cell_rows.get(cid)
            base = c or next(p for p in self.plan if p["cell_id"] == cid)
            row = {
                "cell_id": cid,
                "pass": base["pass"],
                "arm": base["arm"],
                **Point.of(base).fields(),
                "status": c.get("status") if c else "not run",
                "stopped_by": c.get("stopped_by") if c else None,
                "startup_s": _float(c.get("startup_s")) if c else None,
            }
            cs = self.cells.get((base["arm"], Point.of(base), base["pass"])) if c and c.get("status") == "ok" else None
            row.update(cs.to_dict() if cs else {})
            out.append(row)
        return out

    def startup_table(self) -> list[dict[str, Any]]:
        """Per arm: its server starts and what the compile cache saved (e2e/analysis/startups.py)."""
        return startups.startup_table(self.cell_rows.values())

    def start_phases(self) -> list[dict[str, Any]]:
        """Per server start: where its time went, from the server's log."""
        return startups.start_phases(self.cell_rows.values())

    def routing_table(self) -> list[dict[str, Any]]:
        """Per arm and layer class: the attention path taken (e2e/analysis/routing_table.py)."""
        return routing_table.routing_table(self.cell_rows)

    def gpu_time(self) -> dict[str, Any]:
        """Where the run's GPU time went (e2e/analysis/wall_clock.py)."""
        return wall_clock.gpu_time(self.manifest, self.cell_rows.values())

    def concurrency(self) -> dict[str, Any]:
        """Which executors ran the cells, on how many recorded slots, how many at once (e2e/analysis/slots.py)."""
        return slots.concurrency(self.manifest, self.cell_rows.values())

    def arm_table(self) -> list[dict[str, Any]]:
        """Per arm and point: the passes' estimates and their geometric mean."""
        out = []
        for arm in self.arms:
            for d in self.points:
                ests = self._estimates(arm, d)
                gm = None
                if ests and all(v > 0 for v in ests.values()):
                    gm = math.exp(sum(math.log(v) for v in ests.values()) / len(ests))
                out.append(
                    {
                        "arm": arm,
                        **d.fields(),
                        "n_cells": len(ests),
                        "geomean_ms": gm,
                        "per_pass_ms": {str(p): v for p, v in ests.items()},
                    }
                )
        return out

    def _estimates(self, arm: str, point: Point) -> dict[int, float]:
        """pass -> the cell's estimate, for the finished cells of an arm at a point that have one."""
        out = {}
        for p in self.passes:
            cs = self.cells.get((arm, point, p))
            if cs is not None and cs.estimate is not None:
                out[p] = cs.estimate
        return out

    def max_pass_disagreement_pct(self) -> float | None:
        vals = [a["max_rel_diff_pct"] for a in self.agreement if a["max_rel_diff_pct"] is not None]
        return max(vals) if vals else None

    # -- comparisons ------------------------------------------------------------------------
    def _kv_skipped(self, arm: str, point: Point) -> bool:
        """Every cell of arm at point was skipped as the runner does it (the server's KV cache cannot
        hold c requests of that depth: e2e/run/batch.capacity_problem), none failed or refused."""
        rows = [c for c in self.cell_rows.values() if c.get("arm") == arm and Point.of(c) == point]
        return bool(rows) and all(c.get("status") == "skipped" for c in rows)

    def _comparisons(self) -> list[dict[str, Any]]:
        """Per arm and point: a row per pass (ratio and within-server interval, no decision word),
        then the pooled comparison over passes (each server one replicate), decided with Holm's
        correction across the run's arm x point family (e2e/analysis/comparisons.py: the one rule, which
        the validation wing's simulated runs are decided by too)."""
        pooled_of, self.correction = comparisons.decide(
            self.fit, self.arms, self.points, self._cells_of, self.alpha, self.min_effect_pct
        )
        entries: list[tuple[dict[str, Any], verdicts.Comparison]] = []
        for arm in self.arms[1:]:
            ref = self.arms[0]
            for d in self.points:
                for p in self.passes:
                    rc, a = self.cells.get((ref, d, p)), self.cells.get((arm, d, p))
                    if rc is None or a is None:
                        continue
                    entries.append(
                        (
                            {"arm": arm, "reference": ref, **d.fields(), "pass": p, "scope": "pass"},
                            verdicts.within_server_ratio(rc, a, self.alpha, self.min_effect_pct),
                        )
                    )
                head: dict[str, Any] = {"arm": arm, "reference": ref, **d.fields(), "pass": None, "scope": "pooled"}
                entries.append((head, pooled_of[(arm, d)]))
        pooled = [(h, c) for h, c in entries if h["scope"] == "pooled"]
        self._mark_kv_skipped(pooled)
        self._plan_family(pooled)
        # an arm whose patch changed nothing at a point: its verdict is inert, whatever the numbers say
        self.inert = patch_evidence.inert_points(self.cell_rows.values(), self.reference)
        inert_at = {(i["arm"], Point.of(i)): i["findings"] for i in self.inert}
        self.warnings.extend(
            f"{i['arm']} is inert at {Point.of(i)}: "
            + "; ".join(patch_evidence.describe(f) for f in i["findings"])
            + ": its verdict reads inert"
            for i in self.inert
        )
        out = []
        for head, cmp in entries:
            marks: dict[str, Any] = {}
            if head["scope"] == "pooled":
                ma, mr = (
                    self.server_marks(head["arm"], Point.of(head)),
                    self.server_marks(head["reference"], Point.of(head)),
                )
                marks = {k: ma[k] + mr[k] for k in ma}
            row = {**head, **cmp.to_dict(), **marks}
            if head["scope"] == "pooled" and (found := inert_at.get((head["arm"], Point.of(head)))):
                verdicts.read_inert(row, inert=found)  # only rows that recorded counts: older runs' stay as they were
            out.append(row)
            if head["scope"] == "pooled":
                self.warnings.extend(
                    f"{head['arm']} vs {head['reference']} at {Point.of(head)}: {w}" for w in cmp.warnings
                )
        return out

    def _mark_kv_skipped(self, pooled: list[tuple[dict[str, Any], verdicts.Comparison]]) -> None:
        """No estimate because the KV cache could not hold the point: said so (no p-value, so the
        family decided before is the same)."""
        for h, c in pooled:
            if c.decision == verdicts.NODATA and (
                self._kv_skipped(h["arm"], Point.of(h)) or self._kv_skipped(h["reference"], Point.of(h))
            ):
                c.decision = verdicts.NOT_MEASURED_KV
                c.warnings = []  # each skipped cell's reason is in the run's warnings, once

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

    def server_marks(self, arm: str, point: Point) -> dict[str, list[str]]:
        """The servers of a comparison's arm and point that the verdict must not take in silently."""
        keys = [(a, d, p) for (a, d, p) in self.cells if a == arm and d == point]
        nonstat = [
            self.server_of[k]
            for k in keys
            if self.bookends.get(self.server_of[k].split("#")[0], {}).get("status") == "non-stationary"
        ]
        contaminated = [
            r["cell_id"]
            for r in self.cell_rows.values()
            if r.get("arm") == arm
            and Point.of(r) == point
            and r.get("status") == "ok"
            and gpu_rows.cell_summary(r)["counted_contaminated"]
        ]
        return {"non_stationary_servers": nonstat, "contaminated_cells": contaminated}

    def _plan_family(self, pooled: list[tuple[dict[str, Any], verdicts.Comparison]]) -> None:
        """servers_needed for every tested comparison, from the fit (e2e/stats/planning.py) at the
        family's step, for the run's own rounds per point; then the inconclusive notes."""
        tested = [c for _, c in pooled if c.p is not None]
        if self.fit is None or not tested:
            return
        step = tested[0].alpha_step or self.alpha
        rounds = {
            d: max(2, int(np.median([c.n_rounds for (a, dd, p), c in self.cells.items() if dd == d] or [2])))
            for d in self.points
        }
        arms = [a for a in self.arms if any(k[0] == a for k in self.cells)]
        points = [d for d in self.points if all((a, d) in {(k[0], k[1]) for k in self.cells} for a in arms)]
        try:
            need = planning.servers_needed(
                planning.Components.of(self.fit),
                arms,
                points,
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
            c.servers_needed = need.get((head["arm"], Point.of(head)))
            # one function for both figures: they can only disagree by a rounding of the design
            if c.mde_pct is not None and c.servers_needed is not None:
                n_now = min(c.n_ref, c.n_arm)
                if c.mde_pct <= self.target_mde_pct:
                    c.servers_needed = min(c.servers_needed, n_now)
                elif c.servers_needed <= n_now:
                    c.servers_needed = n_now + 1
            verdicts.inconclusive_note(c)

    def cell_ids_of(self, arm: str, point: Point) -> list[str]:
        """The finished cells of an arm at a point, by id."""
        return [
            cid
            for cid, c in self.cell_rows.items()
            if c.get("status") == "ok" and c.get("arm") == arm and Point.of(c) == point
        ]

    def load(self) -> list[dict[str, Any]] | None:
        """Decode under load per arm and point (e2e/analysis/load.py); None for a run at batch 1 only."""
        return load.load_table(self) if any(p.concurrency > 1 for p in self.points) else None

    def _cells_of(self, arm: str, point: Point) -> list[stats.CellStats]:
        return [self.cells[(arm, point, p)] for p in self.passes if (arm, point, p) in self.cells]

    def _agreement(self) -> list[dict[str, Any]]:
        out = []
        for arm in self.arms:
            for d in self.points:
                per = {p: self.cells[(arm, d, p)] for p in self.passes if (arm, d, p) in self.cells}
                ag = stats.pass_agreement(per)
                out.append({"arm": arm, **d.fields(), **ag})
                if ag["flagged"]:
                    self.warnings.append(
                        f"{arm} at {d}: passes {ag['passes']} differ by {ag['max_rel_diff_pct']:.1f} %, "
                        "more than their intervals allow (between-server variance)"
                    )
        return out

    def _roofline(self, record: RunRecord) -> dict[str, Any]:
        """The HBM floor per depth (e2e/gpu/roofline.py: one request's step) and each arm's batch-1
        estimates over it."""
        if record.model_config is None:
            return {"available": False, "reason": record.model_config_missing}
        try:
            measured = bandwidth.measured_gbps(self.manifest.get("gpu_bandwidth"))
            rf = roofline.floors(
                record.model_config,
                sorted({p.depth for p in self.points}),
                self.tp,
                gpu_name(self.manifest),
                self.bandwidth_override,
                measured_gbps=measured,
            )
        except roofline.Unavailable as exc:
            return {"available": False, "reason": str(exc)}
        for d, entry in rf["per_depth"].items():
            for key, floor in (
                ("measured_over_floor", entry["floor_ms"]),
                ("measured_over_measured_floor", entry.get("floor_measured_ms")),
            ):
                entry[key] = (
                    {a: [e / floor for e in self._estimates(a, Point(int(d))).values()] for a in self.arms}
                    if floor
                    else {}
                )
        return rf


def _float(x: Any) -> float | None:
    return None if x is None else float(x)


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
