"""The cell excess's two models, and the rule that chooses between them. Pure, no I/O.

The cell excess (server x point) is either one variance for every point (ONE), or a variance that
grows with the point's own sampling noise (PROPORTIONAL): tau2 * w_p, where w_p is the point's mean
sampling variance of a cell over the noisiest point's (1 at the noisiest point, so tau2 is the
excess there). Whatever makes requests at a long context noisier (prefill jitter) can make servers
differ more there too; with one excess for every point, a 32K excess four times the 1K one left
95 % intervals covering 84-91 % at 32K (conformance, regime h200-growing).

Both models have one parameter, so AIC chooses the one with the larger REML likelihood (both share
the fixed effects, so their REML likelihoods compare); a tie, as when both find no excess, keeps ONE.
A test of one against the other at 5 % cannot serve: with 2-4 servers per arm a point's excess
rests on 2-6 degrees of freedom, and such a test found the growth in 10-30 % of those runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from e2e.stats.point import Point

ONE, PROPORTIONAL = "one for every point", "proportional to the point's noise"
RULE = "AIC (one parameter each: the larger REML likelihood; a tie keeps one for every point)"


def weights(points: list[Point], v: np.ndarray) -> dict[Point, float]:
    """w_p per point from the cells' sampling variances v (points[i] is cell i's point)."""
    mean = {p: float(np.mean([x for q, x in zip(points, v) if q == p])) for p in sorted(set(points))}
    top = max(mean.values())
    return {p: (m / top if top > 0 else 1.0) for p, m in mean.items()}


@dataclass(frozen=True)
class ExcessChoice:
    """Which model the fit took, and the REML log-likelihood gain of PROPORTIONAL over ONE behind it
    (None: a single point, where the two are one model)."""

    model: str
    gain: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "rule": RULE if self.gain is not None else None, "loglik_gain": self.gain}


def choose(neg_loglik_one: float, neg_loglik_prop: float) -> ExcessChoice:
    """The model with the larger REML likelihood; ONE unless PROPORTIONAL is larger by more than
    the search's precision."""
    gain = neg_loglik_one - neg_loglik_prop
    return ExcessChoice(PROPORTIONAL if gain > 1e-6 * (1 + abs(neg_loglik_one)) else ONE, gain)
