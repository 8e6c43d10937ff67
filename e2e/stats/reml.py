"""The REML search of the between-server variance model (e2e/stats/variance_model.py): the
covariance of the cells' log estimates at given components, the REML projection, and Fisher
scoring over the components. Pure, no I/O."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import numpy as np


class Design(Protocol):
    """What the search reads of a variance_model.Design: the fixed effects, the random factors'
    Z Z', the excess's diagonals and dV / d(component) for each component."""

    X: np.ndarray
    ZZs: list[np.ndarray]
    excess_diags: list[np.ndarray]

    @property
    def residual_df(self) -> int: ...

    def mats(self) -> list[np.ndarray]: ...


def covariance(d: Design, v: np.ndarray, theta: Sequence[float] | np.ndarray) -> np.ndarray:
    k = len(d.ZZs)
    V = np.diag(v + sum(t * w for t, w in zip(theta[k:], d.excess_diags)))
    for t, M in zip(theta[:k], d.ZZs):
        V = V + t * M
    return V


def projection(d: Design, V: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float]:
    """(P, Vinv, log|V|, log|X'V^-1 X|) with P = V^-1 - V^-1 X (X'V^-1 X)^-1 X'V^-1. numpy's own
    Cholesky (no input checks): the conformance suite calls this ~10^5 times."""
    L = np.linalg.cholesky(V)
    Li = np.linalg.inv(L)
    Vi = Li.T @ Li
    logdet = 2.0 * float(np.log(np.diagonal(L)).sum())
    ViX = Vi @ d.X
    XtViX = d.X.T @ ViX
    logdet_x = 2.0 * float(np.log(np.diagonal(np.linalg.cholesky(XtViX))).sum())
    P = Vi - ViX @ np.linalg.solve(XtViX, ViX.T)
    return P, Vi, logdet, logdet_x


def fit_components(d: Design, y: np.ndarray, v: np.ndarray) -> tuple[tuple[float, ...], bool, float]:
    """REML estimates of every component (d.kept, then tau2), all >= 0, whether the search says it
    converged, and -log(REML likelihood) there (up to a constant): Fisher scoring with the
    REML information, steps halved until the likelihood does not fall, components that would go
    negative held at 0 (the boundary is common: a server variance the data cannot see)."""
    resid = y - d.X @ np.linalg.lstsq(d.X, y, rcond=None)[0]
    # scale of the search: the residual variance about the group means, or the noise itself
    s0 = max(float(resid @ resid) / max(d.residual_df, 1), float(np.mean(v)), 1e-14)
    mats = d.mats()
    J = len(mats)

    def state(t: np.ndarray) -> tuple[float, np.ndarray, np.ndarray] | None:
        try:
            P, _, ld, ldx = projection(d, covariance(d, v, t))
        except (np.linalg.LinAlgError, ValueError):
            return None
        Py = P @ y
        PM = [P @ M for M in mats]
        score = np.array([-0.5 * (float(np.trace(A)) - float(Py @ (M @ Py))) for A, M in zip(PM, mats)])
        info = np.array([[0.5 * float(np.sum(A * B.T)) for B in PM] for A in PM])
        f = 0.5 * (ld + ldx + float(y @ Py))
        if not (math.isfinite(f) and np.all(np.isfinite(score)) and np.all(np.isfinite(info))):
            return None  # components where V is numerically singular: not a point the search may take
        return f, score, info

    def search(t: np.ndarray) -> tuple[np.ndarray, float, bool]:
        st = state(t)
        if st is None:
            return t, math.inf, False
        f, g, info = st
        for _ in range(100):
            step = np.linalg.pinv(info) @ g
            free = ~((t <= 0) & (g < 0))  # at the bound and pushed out: stays there
            step = np.where(free, step, 0.0)
            lam = 1.0
            moved: tuple[float, np.ndarray, np.ndarray] | None = None  # the state a step reached
            while lam > 1e-6:
                t_new = np.maximum(t + lam * step, 0.0)
                st_new = state(t_new)
                if st_new is not None and st_new[0] <= f + 1e-12 * (1 + abs(f)):
                    moved = st_new
                    break
                lam /= 2
            if moved is None:
                return t, f, True  # no step helps: a (boundary) optimum
            done = np.all(np.abs(t_new - t) <= 1e-6 * s0) or abs(moved[0] - f) <= 1e-10 * (1 + abs(f))
            t, (f, g, info) = t_new, moved
            if done:
                return t, f, True
        return t, f, False

    starts = [np.full(J, s0 / J), np.eye(J)[-1] * s0]
    results = [search(t0) for t0 in starts]
    t, f, ok = min(results, key=lambda r: r[1])
    return tuple(float(x) for x in t), ok, f
