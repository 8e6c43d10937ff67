"""The figures of the conformance table (e2e/stats/conformance.py): a rate with its Monte-Carlo
interval and its target."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from e2e.stats import signoff
from e2e.stats import verdicts as v


# -- figures ------------------------------------------------------------------------------------
@dataclass
class Figure:
    key: str
    what: str
    design: str
    value: float
    n: int | None = None  # experiments behind a rate (None: a computed value)
    target: str = ""
    ok: bool | None = None  # None: reported, no target

    @property
    def interval(self) -> tuple[float, float] | None:
        if self.n is None:
            return None
        return signoff.proportion_interval(round(self.value * self.n), self.n, 0.95, "wilson")


def tol(p: float, n: int) -> float:
    """The stated Monte-Carlo tolerance: 3 standard errors of a rate p over n experiments."""
    return 3 * math.sqrt(p * (1 - p) / n)


def rate(xs: list[bool]) -> float:
    return float(np.mean(xs)) if xs else float("nan")


def at_most(key: str, what: str, design: str, xs: list[bool], p: float) -> Figure:
    r = rate(xs)
    return Figure(
        key, what, design, r, len(xs), f"<= {100 * p:g} % (+{100 * tol(p, len(xs)):.1f} MC)", r <= p + tol(p, len(xs))
    )


def at_least(key: str, what: str, design: str, xs: list[bool], p: float) -> Figure:
    return Figure(key, what, design, rate(xs), len(xs), "always" if p == 1 else f">= {100 * p:g} %", rate(xs) >= p)


def covers_one(c: v.Comparison) -> bool:
    """The interval covers the true ratio of an A/A design (no interval: it covers nothing)."""
    return c.ci is not None and c.ci[0] <= 1 <= c.ci[1]
