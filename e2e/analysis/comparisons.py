"""A run's comparisons: every arm against the reference (the first arm) at every point, pooled over
the servers by the run's variance model, decided together with Holm's correction across the arm x
point family (e2e/stats/verdicts.py). One function for both deciders: RunAnalysis decides a run with
it, and the validation wing's simulated runs (e2e/validation/simulation.py) are decided by it too, so
the conformance figures are figures about this rule."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from e2e.design.point import Point
from e2e.stats import cells as stats
from e2e.stats import variance_model as vm
from e2e.stats import verdicts

CellsOf = Callable[[str, Point], list[stats.CellStats]]  # (arm, point) -> its finished cells, one per server


def decide(
    fit: vm.Fit | None,
    arms: Sequence[str],
    points: Sequence[Point],
    cells_of: CellsOf,
    alpha: float,
    min_effect_pct: float,
) -> tuple[dict[tuple[str, Point], verdicts.Comparison], str]:
    """(arm, point) -> its pooled comparison against arms[0], in arm then point order, decided as one
    family; and the line saying which correction was applied."""
    out: dict[tuple[str, Point], verdicts.Comparison] = {}
    for arm in arms[1:]:
        ref = arms[0]
        for p in points:
            out[(arm, p)] = verdicts.model_comparison(
                fit, arm, ref, p, cells_of(ref, p), cells_of(arm, p), alpha, min_effect_pct
            )
    return out, verdicts.decide_family(list(out.values()), alpha, "holm")
