"""One arm at one point over its servers: the variance model's mean with its t interval (the
estimate each arm gets beside the comparisons in compare and history)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from e2e.design.point import Point
from e2e.stats import variance_model as vm
from e2e.stats.cells import LEVEL, CellStats
from e2e.stats.verdicts import BETWEEN, WITHIN_ONE, t_quantile


def arm_estimate(
    fit: vm.Fit | None, arm: str, point: Point, cells: Sequence[CellStats], level: float = LEVEL
) -> dict[str, Any]:
    """One arm at one point over its servers: the model's mean and its t interval (Satterthwaite
    df), ci_kind "between-server". One cell: that cell's own interval, "within-server (one server)"."""
    ok = [c for c in cells if c.estimate is not None and c.estimate > 0]
    k = len(ok)
    if k == 0:
        return {"estimate_ms": None, "ci_lo_ms": None, "ci_hi_ms": None, "n_cells": 0, "ci_kind": None}
    e = fit.mean(arm, point) if k > 1 and fit is not None else None
    if e is None:
        c = ok[0] if k == 1 else None
        if c is None:
            gm = math.exp(float(np.mean(np.log([x.estimate for x in ok if x.estimate]))))  # every one of ok
            return {"estimate_ms": gm, "ci_lo_ms": None, "ci_hi_ms": None, "n_cells": k, "ci_kind": None}
        lo, hi = c.ci or (None, None)
        return {
            "estimate_ms": c.estimate,
            "ci_lo_ms": lo,
            "ci_hi_ms": hi,
            "n_cells": 1,
            "ci_kind": WITHIN_ONE if c.ci else None,
        }
    h = t_quantile(0.5 + level / 2, e.df) * e.se
    return {
        "estimate_ms": math.exp(e.value),
        "ci_lo_ms": math.exp(e.value - h),
        "ci_hi_ms": math.exp(e.value + h),
        "n_cells": k,
        "ci_kind": BETWEEN,
        "df": e.df,
    }


def pooled_estimate(cells: Sequence[CellStats], level: float = LEVEL) -> dict[str, Any]:
    """arm_estimate for a plain list of cells at one depth, each its own server."""
    f = vm.fit([("arm", Point(1), f"s{i}", c) for i, c in enumerate(cells)])
    return arm_estimate(f, "arm", Point(1), cells, level)
