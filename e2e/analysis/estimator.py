"""The estimator of every arm and point (e2e/stats/estimate.py, judged by e2e/stats/prefill_guard.py),
the run's statement of them, and the bookends tested under them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from e2e.design.point import Point
from e2e.stats import bookends, estimate, prefill_guard
from e2e.stats import cells as stats

ArmPoint = tuple[str, Point]


@dataclass
class Choice:
    """What choose_estimator decided: per arm and point the estimator and why, the cells' statistics
    under it, and the run's one-line statement."""

    name: str  # the one estimator of every arm and point, or estimate.MIXED
    note: str
    warning: str | None
    by_point: dict[ArmPoint, prefill_guard.Trust] = field(default_factory=dict)
    cells: dict[str, stats.CellStats] = field(default_factory=dict)  # cell id -> its statistics
    estimator_of: dict[str, str] = field(default_factory=dict)  # cell id -> its estimator

    def rows(self) -> list[dict[str, Any]]:
        """Per arm and point, in point order: the summary's and the manifest's statement."""
        return [
            {"arm": a, **p.fields(), **t.to_dict()}
            for (a, p), t in sorted(self.by_point.items(), key=lambda x: x[0][1])
        ]


def choose_estimator(
    setting: str,
    ok: Mapping[str, dict[str, Any]],
    by_cell: Mapping[str, list[dict[str, Any]]],
    n_long: int,
    n_short: int,
    min_effect_pct: float,
    client_at: Collection[ArmPoint] = (),
) -> Choice:
    """Per arm and point of the finished cells `ok` (cell id -> cell row): the prefill-corrected
    estimate where the setting allows it and the prefill guard trusts the server's timings
    (prefill_guard.judge), else the plain client estimate; a warning names the points that fell back.
    `client_at`: arm x points put on the plain client estimate whatever the guard says (`compare`
    does it where the other run is on it, so both sides of a row share one definition)."""
    groups: dict[ArmPoint, list[str]] = defaultdict(list)
    for cid, c in ok.items():
        groups[(c["arm"], Point.of(c))].append(cid)
    choice = Choice(estimate.CLIENT, "", None)
    plains: dict[ArmPoint, dict[str, stats.CellStats]] = {}
    for key, cids in groups.items():
        plain = plains[key] = {cid: stats.cell_stats(by_cell.get(cid, []), n_long, n_short) for cid in cids}
        if setting == estimate.CLIENT:
            trust = prefill_guard.Trust(estimate.CLIENT, 'stats.estimator = "client"')
            chosen = plain
        elif key in client_at:
            trust = prefill_guard.Trust(estimate.CLIENT, "the run compared with this one is on the plain estimate here")
            chosen = plain
        else:
            corr = {
                cid: stats.cell_stats(by_cell.get(cid, []), n_long, n_short, estimator=estimate.CORRECTED)
                for cid in cids
            }
            trust = prefill_guard.judge(
                [(by_cell.get(cid, []), corr[cid], plain[cid]) for cid in cids], n_long, n_short, min_effect_pct
            )
            chosen = corr if trust.estimator == estimate.CORRECTED else plain
        choice.by_point[key] = trust
        choice.cells.update(chosen)
        choice.estimator_of.update({cid: trust.estimator for cid in cids})
    _one_definition_per_point(choice, groups, plains)
    _state(choice, setting)
    return choice


def _one_definition_per_point(
    choice: Choice, groups: Mapping[ArmPoint, list[str]], plains: Mapping[ArmPoint, dict[str, stats.CellStats]]
) -> None:
    """Every arm at a point on one estimator: the plain client one where any arm there is on it
    (prefill_guard.plain_points says why)."""
    client = prefill_guard.plain_points({k: t.estimator for k, t in choice.by_point.items()})
    for (arm, p), t in list(choice.by_point.items()):
        if p in client and t.estimator != estimate.CLIENT:
            others = sorted(a for (a, q), u in choice.by_point.items() if q == p and u.estimator == estimate.CLIENT)
            choice.by_point[(arm, p)] = prefill_guard.Trust(
                estimate.CLIENT, f"one estimator per point: {', '.join(others)} at this point is on the plain estimate"
            )
            choice.cells.update(plains[(arm, p)])
            choice.estimator_of.update({cid: estimate.CLIENT for cid in groups[(arm, p)]})


def _state(choice: Choice, setting: str) -> None:
    """The run's name, note and warning from its arms' and points' choices."""
    names = {t.estimator for t in choice.by_point.values()}
    fell = [
        f"{a} at {p} ({t.why})"
        for (a, p), t in sorted(choice.by_point.items(), key=lambda x: x[0][1])
        if t.estimator == estimate.CLIENT
    ]
    if setting == estimate.CLIENT:
        choice.name, choice.note = estimate.CLIENT, 'the plain client estimate (stats.estimator = "client")'
        return
    checked = (
        f"the prefill guard (long minus short request's server prefill within +-{prefill_guard.GUARD_SHARE:g} x "
        "the min effect of the estimate; every cell agreeing with the plain estimate; no noisier than it)"
    )
    if not names:
        choice.name, choice.note = estimate.CORRECTED, "no finished cell: nothing to estimate"
        return
    if names == {estimate.CORRECTED}:
        choice.name = estimate.CORRECTED
        choice.note = (
            f"client wall time minus the server's own prefill time at every arm and point, each passing {checked}"
        )
        return
    shown = "; ".join(fell[:6]) + (f"; and {len(fell) - 6} more" if len(fell) > 6 else "")
    if names == {estimate.CLIENT}:
        choice.name = estimate.CLIENT
        choice.note = f"the plain client estimate at every arm and point (fallback: {shown})"
    else:
        choice.name = estimate.MIXED
        choice.note = (
            f"client wall time minus the server's own prefill time where it passes {checked}; "
            f"the plain client estimate at {shown}"
        )
    choice.warning = (
        f"estimator: the plain client estimate at {len(fell)} of {len(choice.by_point)} arm x point(s): {shown}"
    )


def bookends_under(
    cell_rows: dict[str, dict[str, Any]],
    requests: list[dict[str, Any]],
    estimator_of: Mapping[str, str],
    n_long: int,
    n_short: int,
) -> dict[str, dict[str, Any]]:
    """The cell rows with each bookend tested under the estimator of its opening cell (bookends.retest):
    a server's drift is judged on the values its cells were estimated with."""
    out = {}
    for cid, row in cell_rows.items():
        b = row.get("bookend")
        if not b:
            out[cid] = row
            continue
        est = estimator_of.get(b.get("cell_id") or cid, estimate.CLIENT)
        out[cid] = {**row, "bookend": bookends.retest(b, requests, est, n_long, n_short)}
    return out
