"""The cell excess's three models, and the rule that chooses between them. Pure, no I/O.

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

Both tie every point's excess to one number, so 1K and 8K pull the 32K excess toward their shape.
Where the excess grows faster than the noise (regime h200-growing: 1 : 4 : 64 in variance against
noise weights of about 0.05 : 0.17 : 1), the final fit's 32K excess read 40 % low and 32K intervals
covered 91-93 % with 4 servers per arm and after an adaptive second stage. So once every arm holds
at least MIN_SERVERS cells at every point, each point gets an excess of its own (PER_POINT), fitted
from that point's cells alone (and the server effect they share): 32K coverage 97.0 % with 4
servers per arm (200 runs) and 95.3 % after the adaptive second stage (2000 runs), the price being
wider intervals where the excess does not grow (the 32K MDE of an A/A of 4 servers per arm 1.31 ->
1.47 % in regime h200). Chosen by the design, not by a test: offered to AIC as a third model,
PER_POINT was taken in 6 % of the final adaptive fits and left 32K at 92.1 %. Below MIN_SERVERS a
point's own excess would rest on 2 degrees of freedom or fewer (docs/statistics/between-arms.md).

Above batch 1 servers differ more (a server x concurrency term: batch_blocks). Below MIN_SERVERS each
concurrency above batch 1 has an excess of its own (BATCH), shared by its depths, and only the
batch-1 points take the AIC choice of ONE or PROPORTIONAL.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from e2e.design.point import Point

ONE, PROPORTIONAL, PER_POINT = "one for every point", "proportional to the point's noise", "one per point"
BATCH = "one per concurrency above batch 1"  # and ONE or PROPORTIONAL over the batch-1 points
MIN_SERVERS = 3  # cells per arm and point from which each point's excess is its own
RULE = "AIC (one parameter each: the larger REML likelihood; a tie keeps one for every point)"
PER_POINT_RULE = f"every arm has at least {MIN_SERVERS} servers at every point"
BATCH_RULE = f"fewer than {MIN_SERVERS} servers per arm somewhere: each concurrency above batch 1 has its own"


def batch_blocks(groups: Iterable[tuple[str, Point]]) -> tuple[tuple[Point, ...], ...]:
    """Where per_point_supported does not hold: the points above batch 1 whose groups all hold 2
    cells or more (one entry per cell), one block per concurrency; each block has an excess of its
    own, a server x concurrency term shared by that concurrency's depths. Batch c has a term of its
    own (about 1.9 % per server at c >= 16 in the committed FA3 pass pairs): tied to the batch-1
    points' excess (ONE) or to the point's noise (PROPORTIONAL) the quietest point (1K x 32) got
    almost none and covered 68.5 % (A/A family-wise 12.0 %, regime h200-grid, 200 runs). One term
    for every c > 1 held only while the term is equal at every c (c = 4 at 0.5 % and c >= 16 at
    2.5 %: 91.5 %); one per point rests on 2 degrees of freedom (printed MDEs 30-50 %)."""
    n = Counter(groups)
    c_of = {p: getattr(p, "concurrency", 1) for _, p in n}  # a bare depth (an int) is batch 1
    own = sorted(p for p, c in c_of.items() if c > 1 and min(k for (_, q), k in n.items() if q == p) >= 2)
    return tuple(tuple(p for p in own if c_of[p] == c) for c in sorted({c_of[p] for p in own}))


def per_point_supported(groups: Iterable[tuple[str, Point]]) -> bool:
    """Whether cells of these (arm, point) groups, one entry per cell, give each point an excess of
    its own: more than one point, and every group holding MIN_SERVERS cells."""
    n = Counter(groups)
    return len({p for _, p in n}) > 1 and min(n.values()) >= MIN_SERVERS


def weights(points: list[Point], v: np.ndarray) -> dict[Point, float]:
    """w_p per point from the cells' sampling variances v (points[i] is cell i's point)."""
    mean = {p: float(np.mean([x for q, x in zip(points, v) if q == p])) for p in sorted(set(points))}
    top = max(mean.values())
    return {p: (m / top if top > 0 else 1.0) for p, m in mean.items()}


@dataclass(frozen=True)
class ExcessChoice:
    """Which model the fit took, and the REML log-likelihood gain of PROPORTIONAL over ONE behind it
    (None: a single point, where the two are one model, or PER_POINT, which the design chose)."""

    model: str
    gain: float | None = None

    shared: str | None = None  # BATCH: the batch-1 points' model (ONE or PROPORTIONAL)

    def to_dict(self) -> dict[str, Any]:
        rule = PER_POINT_RULE if self.model == PER_POINT else RULE if self.gain is not None else None
        if self.model != BATCH:
            return {"model": self.model, "rule": rule, "loglik_gain": self.gain}
        return {"model": self.model, "rule": BATCH_RULE, "loglik_gain": self.gain, "batch_1": self.shared}


def choose(neg_loglik_one: float, neg_loglik_prop: float) -> ExcessChoice:
    """The model with the larger REML likelihood; ONE unless PROPORTIONAL is larger by more than
    the search's precision."""
    gain = neg_loglik_one - neg_loglik_prop
    return ExcessChoice(PROPORTIONAL if gain > 1e-6 * (1 + abs(neg_loglik_one)) else ONE, gain)
