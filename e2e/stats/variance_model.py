"""The between-server variance model: every server and point of a run in one fit. Pure, no I/O.

A cell is one server at one point (depth, concurrency: e2e/design/point.py); y = log(its estimate).
The model (docs, "Between arms"):

    y_i = mu[arm_i, point_i] + u[server_i] + e_i
    u ~ N(0, sigma2_server)            a server's offset, shared by every point it serves
    e_i ~ N(0, tau2 w_i + v_i)         the cell's own excess (server x point) plus its sampling noise

* v_i, the cell's sampling variance, is the robust one of e2e.stats.cells (the MAD of each length's
  values scaled to a median's variance), pooled over the cells of its arm and point: servers of
  one arm at one point share a noise level per request (it grows with the depth: prefill jitter),
  and one cell's 6 rounds give a scale with ~2 degrees of freedom. Pooled per (arm, point) and
  length, relative to each cell's own difference, weighted by those degrees of freedom.
* The excess is one for every point (w_i = 1) or grows with the point's sampling noise (w_i: the
  point's mean v at the design's median rounds over the noisiest point's), whichever has the larger REML likelihood;
  once every arm has ex.MIN_SERVERS servers at every point, each point has an excess of its own
  (tau2_p: one component per point). Below that, each concurrency above batch 1 has an excess of its
  own (a server x concurrency term shared by its depths, ex.batch_blocks; ex.BATCH) and only the
  batch-1 points share the one or proportional excess. e2e/stats/excess.py says why.
* sigma2_server and tau2 are estimated by REML (restricted maximum likelihood) from all servers
  and depths together. With one cell per server (fresh mode) the two cannot be told apart and one
  component, tau2, carries both. statsmodels' MixedLM estimates a single residual scale and has no
  per-observation known sampling variances, which this needs (v_i differ 100x between 1K and 32K);
  the fit is ~60 lines of linear algebra (e2e/stats/reml.py), checked against statsmodels where both apply
  (tests/unit/stats/test_variance_model.py).
* A contrast (arm vs reference at one point, a difference of mu's) is estimated by GLS; its
  variance c'(X'V^-1 X)^-1 c, and its degrees of freedom by Satterthwaite: the uncertainty of
  sigma2_server and tau2 (from the REML information) and of every pooled noise level (from its
  degrees of freedom) propagated to the contrast's variance. Few servers and a large server
  variance give few degrees of freedom (2 + 2 servers: about 2); a server variance that the data
  show to be small next to the cells' own noise gives many. The conformance suite
  (e2e/validation/conformance.py) checks coverage and error rates by simulation.
* The same computation serves planning (e2e/stats/planning.py): the variance and degrees of freedom of
  a design not yet run, from a fit's components.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from e2e.design.point import Point
from e2e.stats import excess as ex
from e2e.stats import reml
from e2e.stats.cells import CellStats, median_variance_factor

MAX_DF = 1000.0  # beyond this a t quantile is the normal's
SERVER_CELL, CELL_ONLY = "server + cell", "cell"
PROPORTIONAL, PER_POINT, BATCH = ex.PROPORTIONAL, ex.PER_POINT, ex.BATCH  # the excess models a report names
MIN_SERVERS = ex.MIN_SERVERS  # servers per arm from which every point has an excess of its own


@dataclass(frozen=True)
class Cell:
    """One cell as the model sees it: where it ran and its noise (no estimate: a design)."""

    arm: str
    point: Point
    server: str
    n_long: int  # values behind each median
    n_short: int
    run: str = ""  # history: the run the server belongs to (a random factor there)


@dataclass
class Design:
    """Cells, their groups (arm, point: the fixed effects) and random factors (the server; in a
    history also the run). A factor whose levels each hold one cell is the cell's own excess
    (tau2) by another name, and one with a single level is the mean's: both are left out."""

    cells: list[Cell]
    factors: tuple[str, ...] = ("server",)
    extra: np.ndarray | None = None  # known extra variance per cell (a non-stationary server's drift)
    weights: dict[Point, float] | None = None  # the excess's weight per point (ex.PROPORTIONAL); None: 1 (ex.ONE)
    per_point: bool = False  # an excess variance of its own at every point (ex.PER_POINT)
    own: tuple[tuple[Point, ...], ...] = ()  # else blocks of points with an excess each (ex.BATCH), the rest's shared

    def __post_init__(self) -> None:
        self.groups = sorted({(c.arm, c.point) for c in self.cells}, key=lambda g: (g[1], g[0]))
        self.servers = sorted({c.server for c in self.cells})
        gi = {g: j for j, g in enumerate(self.groups)}
        n = len(self.cells)
        self.extra = np.zeros(n) if self.extra is None else np.asarray(self.extra, dtype=float)
        self.X = np.zeros((n, len(self.groups)))
        # k factors of a cell's two medians (variance of a median = k * per-value variance)
        self.k_long = np.zeros((n, len(self.groups)))
        self.k_short = np.zeros((n, len(self.groups)))
        for i, c in enumerate(self.cells):
            j = gi[(c.arm, c.point)]
            self.X[i, j] = 1.0
            self.k_long[i, j] = median_variance_factor(c.n_long)[0]
            self.k_short[i, j] = median_variance_factor(c.n_short)[0]
        self.kept: list[str] = []  # the random factors with a component of their own
        self.unestimable: list[str] = []  # factors no group holds two levels of (e.g. one run a side)
        self.ZZs: list[np.ndarray] = []
        for name in self.factors:
            labels = [getattr(c, name) for c in self.cells]
            levels = sorted(set(labels))
            Z = np.array([[1.0 if lab == lev else 0.0 for lev in levels] for lab in labels]).reshape(n, len(levels))
            ZZ = Z @ Z.T
            if len(levels) < 2 or Z.sum(axis=0).max() <= 1 or any(np.array_equal(ZZ, m) for m in self.ZZs):
                continue
            per_group = {g: {lab for lab, c in zip(labels, self.cells) if (c.arm, c.point) == g} for g in self.groups}
            if max(len(v) for v in per_group.values()) < 2:
                self.unestimable.append(name)
                continue
            self.kept.append(name)
            self.ZZs.append(ZZ)
        self.components = (
            SERVER_CELL if self.kept == ["server"] else " + ".join(self.kept + ["cell"]) if self.kept else CELL_ONLY
        )
        self.excess = ex.PER_POINT if self.per_point else ex.ONE if self.weights is None else ex.PROPORTIONAL
        self.w = np.array([1.0 if self.weights is None else self.weights.get(c.point, 1.0) for c in self.cells])
        # the points with an excess of their own; the others share one (ONE or PROPORTIONAL)
        self.blocks = [(p,) for p in sorted({c.point for c in self.cells})] if self.per_point else list(self.own)
        self.points = sorted(p for b in self.blocks for p in b)
        shared = np.array([0.0 if c.point in self.points else 1.0 for c in self.cells])
        self.excess_diags = [np.array([1.0 if c.point in b else 0.0 for c in self.cells]) for b in self.blocks]
        self.excess_diags += [self.w * shared] if shared.any() else []

    def mats(self) -> list[np.ndarray]:
        """dV / d(component) for each component, the cell's excess (its weight on the diagonal, or one
        per point) last."""
        return self.ZZs + [np.diag(w) for w in self.excess_diags]

    def group(self, arm: str, point: Point) -> int | None:
        try:
            return self.groups.index((arm, point))
        except ValueError:
            return None

    def n_per_group(self) -> np.ndarray:
        n: np.ndarray = self.X.sum(axis=0)
        return n

    @property
    def residual_df(self) -> int:
        return len(self.cells) - len(self.groups)


@dataclass
class Noise:
    """Pooled per-value relative variance per group and length (q, columns long, short) and the
    degrees of freedom behind each (nu)."""

    q: np.ndarray
    nu: np.ndarray

    def v(self, d: Design) -> np.ndarray:
        """Each cell's sampling variance of log(estimate), and any known extra variance."""
        v: np.ndarray = d.k_long @ self.q[:, 0] + d.k_short @ self.q[:, 1] + d.extra
        return v


@dataclass
class Estimate:
    value: float  # on the log scale
    se: float
    df: float


@dataclass
class Fit:
    design: Design
    y: np.ndarray
    noise: Noise
    theta: tuple[float, ...]  # one variance per kept factor (design.kept), then tau2
    beta: np.ndarray
    converged: bool
    warnings: list[str] = field(default_factory=list)
    _inference: Inference | None = field(default=None, repr=False)
    excess: ex.ExcessChoice = ex.ExcessChoice(ex.ONE)  # the excess's model and why

    def component(self, name: str) -> float:
        """A factor's variance (0 for one the design could not separate from the cell's excess)."""
        return self.theta[self.design.kept.index(name)] if name in self.design.kept else 0.0

    @property
    def sigma2_server(self) -> float:
        return self.component("server")

    @property
    def tau2(self) -> float:
        """The cell excess's variance (at the noisiest point when it is proportional to the noise; the
        largest point's when each point has its own)."""
        return max(self.theta[len(self.design.ZZs) :])

    def tau2_at(self, point: Point) -> float:
        own = [j for j, b in enumerate(self.design.blocks) if point in b]
        if own:
            return self.theta[len(self.design.ZZs) + own[0]]
        return self.theta[-1] * (1.0 if self.design.weights is None else self.design.weights.get(point, 1.0))

    @property
    def excess_weights(self) -> dict[Point, float] | None:
        """The excess per point over its largest (None: one for every point), as planning reads it."""
        if not self.design.points:
            return self.design.weights
        top = self.tau2
        return {c.point: (self.tau2_at(c.point) / top if top > 0 else 1.0) for c in self.design.cells}

    def contrast(self, arm: str, ref: str, point: Point) -> Estimate | None:
        """log(mu[arm, point]) - log(mu[ref, point]), or None when a group is missing."""
        a, r = self.design.group(arm, point), self.design.group(ref, point)
        if a is None or r is None:
            return None
        c = np.zeros(len(self.design.groups))
        c[a], c[r] = 1.0, -1.0
        return self._estimate(c)

    def mean(self, arm: str, point: Point) -> Estimate | None:
        g = self.design.group(arm, point)
        if g is None:
            return None
        c = np.zeros(len(self.design.groups))
        c[g] = 1.0
        return self._estimate(c)

    def covariance(self, arm: str, ref: str, point: Point) -> np.ndarray | None:
        """The 2 x 2 covariance of (mu[arm], mu[ref]) on the log scale (for ms differences)."""
        a, r = self.design.group(arm, point), self.design.group(ref, point)
        if a is None or r is None:
            return None
        cov: np.ndarray = self.inference.C[np.ix_([a, r], [a, r])]
        return cov

    @property
    def inference(self) -> Inference:
        if self._inference is None:
            self._inference = Inference(self.design, self.noise, self.theta)
        return self._inference

    def _estimate(self, c: np.ndarray) -> Estimate:
        var, df = self.inference.contrast(c)
        return Estimate(float(c @ self.beta), math.sqrt(var), df)

    def to_dict(self) -> dict[str, Any]:
        """What a report shows of the fit, and what planning reads back (e2e/stats/planning.py)."""
        groups = []
        for j, (arm, point) in enumerate(self.design.groups):
            groups.append(
                {
                    "arm": arm,
                    **point.fields(),
                    "n_cells": int(self.design.n_per_group()[j]),
                    "rel_sd_long": math.sqrt(self.noise.q[j, 0]),
                    "rel_sd_short": math.sqrt(self.noise.q[j, 1]),
                    "df_long": float(self.noise.nu[j, 0]),
                    "df_short": float(self.noise.nu[j, 1]),
                    **(
                        {"sd_cell_excess": math.sqrt(self.tau2_at(point))}
                        if self.design.weights or self.design.points
                        else {}
                    ),
                }
            )
        return {
            "components": self.design.components,
            "sd_server": math.sqrt(self.sigma2_server),
            "sd_cell_excess": math.sqrt(self.tau2),
            **{f"sd_{n}": math.sqrt(self.component(n)) for n in self.design.kept if n != "server"},
            "cell_excess": self.excess.to_dict(),
            "n_cells": len(self.design.cells),
            "n_servers": len(self.design.servers),
            "converged": self.converged,
            "groups": groups,
            "method": "REML, Satterthwaite degrees of freedom",
            "warnings": list(self.warnings),
        }


# -- the pooled noise -------------------------------------------------------------------------------
def pool_noise(d: Design, cells: Sequence[CellStats]) -> Noise:
    """Per group and length: the df-weighted mean of the cells' per-value variance relative to the
    cell's own difference of medians (so a server's offset, which scales both, drops out)."""
    G = len(d.groups)
    num, den = np.zeros((G, 2)), np.zeros((G, 2))
    for c, cs in zip(d.cells, cells):
        j = d.group(c.arm, c.point)
        if cs.estimate is None or cs.noise is None:
            continue  # no noise to pool (fit keeps no such cell)
        diff_s = cs.estimate * (cs.n_long - cs.n_short) / 1e3
        for col, (n, scale) in enumerate(
            ((cs.noise.n_long, cs.noise.scale_long), (cs.noise.n_short, cs.noise.scale_short))
        ):
            if scale is None or n < 2:
                continue
            nu = median_variance_factor(n)[1]
            num[j, col] += nu * (scale / diff_s) ** 2
            den[j, col] += nu
    with np.errstate(invalid="ignore", divide="ignore"):
        q = np.where(den > 0, num / np.where(den > 0, den, 1), 0.0)
    return Noise(q, den)


def noise_at_median_rounds(d: Design, noise: Noise) -> np.ndarray:
    """Each cell's sampling variance as if it had run the design's median rounds: its point's noise,
    not its rounds. The proportional excess is weighed by this (excess.weights): weighed by the
    cells' own variances, a point whose later cells ran more rounds (an adaptive second stage at
    32K) would lose excess in the fit for it. Equal to noise.v(d) when every cell ran equal rounds."""
    k_long = median_variance_factor(int(np.median([c.n_long for c in d.cells])))[0]
    k_short = median_variance_factor(int(np.median([c.n_short for c in d.cells])))[0]
    v: np.ndarray = k_long * (d.X @ noise.q[:, 0]) + k_short * (d.X @ noise.q[:, 1]) + d.extra
    return v


class Inference:
    """The algebra at one point (design, noise, components): the fixed effects' covariance and,
    for any contrast, its variance and Satterthwaite degrees of freedom. Built once per fit (or
    planned design) and asked about every contrast."""

    def __init__(self, d: Design, noise: Noise, theta: Sequence[float]):
        self.d, self.noise, self.theta = d, noise, tuple(theta)
        P, Vi, _, _ = reml.projection(d, reml.covariance(d, noise.v(d), theta))
        self.ViX = Vi @ d.X
        self.C = np.linalg.inv(d.X.T @ self.ViX)
        self.mats = d.mats()
        PM = [P @ M for M in self.mats]
        info = np.array([[0.5 * float(np.sum(A * B.T)) for B in PM] for A in PM])
        self.cov_theta = np.linalg.pinv(info)  # the REML components' covariance
        with np.errstate(divide="ignore", invalid="ignore"):
            # var(q_hat) = 2 q^2 / nu for every pooled noise level (group x length)
            self.var_q = np.where(noise.nu > 0, 2 * noise.q**2 / np.where(noise.nu > 0, noise.nu, 1), 0.0)

    def contrast(self, c: np.ndarray) -> tuple[float, float]:
        """(variance, degrees of freedom) of c'beta_hat."""
        Cc = self.C @ c
        var = float(c @ Cc)
        w = self.ViX @ Cc  # d var / d theta_j = w' V_j w
        g = np.array([float(w @ M @ w) for M in self.mats])
        spread = float(g @ self.cov_theta @ g)
        w2 = w**2
        spread += float(np.sum(((w2 @ self.d.k_long) ** 2) * self.var_q[:, 0]))
        spread += float(np.sum(((w2 @ self.d.k_short) ** 2) * self.var_q[:, 1]))
        df = MAX_DF if spread <= 0 else min(MAX_DF, max(1.0, 2 * var * var / spread))
        return var, df


def planned(
    cells: Sequence[Cell], sigma2_server: float, tau2: float, weights: dict[Point, float] | None
) -> tuple[Design, tuple[float, ...]]:
    """A design not yet run and its components, under the excess model its fit would take (fit
    below): one per point (tau2 * w_p each) where every arm will hold ex.MIN_SERVERS cells at every
    point, else one per point above batch 1 (ex.batch_blocks) and tau2 weighed by the points'
    weights elsewhere. Without a server factor (one cell per server) the server's variance joins
    the excess."""
    excess: tuple[float, ...] = (tau2,)
    groups = [(c.arm, c.point) for c in cells]
    if ex.per_point_supported(groups):
        d = Design(list(cells), per_point=True)
    else:
        d = Design(list(cells), weights=weights, own=ex.batch_blocks(groups))
    if d.blocks:
        own = tuple(tau2 * (weights or {}).get(b[0], 1.0) for b in d.blocks)
        excess = own + ((tau2,) if len(d.excess_diags) > len(d.blocks) else ())
    return d, ((sigma2_server, *excess) if d.kept else tuple(sigma2_server + t for t in excess))


def contrast_variance(d: Design, noise: Noise, theta: Sequence[float], c: np.ndarray) -> tuple[float, float]:
    """(variance, Satterthwaite degrees of freedom) of c'beta_hat in design d at the components
    theta (one per d.kept, then tau2) and pooled noise `noise` (whose nu says how well each noise
    level is known): the uncertainty of the components (inverse REML information) and of the
    noise levels propagated to the contrast's variance."""
    return Inference(d, noise, theta).contrast(c)


# -- the fit ----------------------------------------------------------------------------------------
def _shared_excess(
    vcells: list[Cell],
    factors: tuple[str, ...],
    known: np.ndarray,
    y: np.ndarray,
    noise: Noise,
    own: tuple[tuple[Point, ...], ...],
) -> tuple[Design, tuple[float, ...], bool, ex.ExcessChoice]:
    """The fit when not every point can have an excess of its own: the points `own` (above batch 1,
    ex.batch_blocks) each have theirs, the others share one excess, one for every point or
    proportional to the point's noise, whichever AIC prefers."""
    d = Design(vcells, factors, known, own=own)
    theta, ok, f_one = reml.fit_components(d, y, noise.v(d))
    choice = ex.ExcessChoice(ex.ONE)
    rest = [i for i, c in enumerate(vcells) if c.point not in d.points]
    if len({vcells[i].point for i in rest}) > 1:  # at one point the two models are one
        w = ex.weights([vcells[i].point for i in rest], noise_at_median_rounds(d, noise)[rest])
        dp_ = Design(vcells, factors, known, w, own=own)
        theta_p, ok_p, f_p = reml.fit_components(dp_, y, noise.v(dp_))
        choice = ex.choose(f_one, f_p)
        if choice.model == ex.PROPORTIONAL:
            d, theta, ok = dp_, theta_p, ok_p
    if own:
        choice = ex.ExcessChoice(ex.BATCH, choice.gain, choice.model if rest else None)
    return d, theta, ok, choice


def fit(
    cells: Sequence[tuple[str, Point, str, CellStats]],
    factors: tuple[str, ...] = ("server",),
    runs: Sequence[str] | None = None,
    extra: dict[str, float] | None = None,
    per_point: bool = True,
) -> Fit | None:
    """(arm, point, server, CellStats) per cell with an estimate > 0 and a robust noise (runs: the
    run of each, for a history's run factor; extra: server -> a known extra variance of each of its
    cells' log estimates; per_point: an excess per point where ex.per_point_supported says so,
    False: never, the AIC choice of one or proportional). None when nothing is left to estimate a
    variance from (each arm and point on one server at most)."""
    runs = list(runs) if runs is not None else [""] * len(cells)
    keep = [
        (a, dp, s, cs, cs.estimate, cs.noise, r)
        for (a, dp, s, cs), r in zip(cells, runs)
        if cs.estimate is not None and cs.estimate > 0 and cs.noise is not None
    ]
    if not keep:
        return None
    vcells = [Cell(a, dp, s, nz.n_long, nz.n_short, r) for a, dp, s, _, _, nz, r in keep]
    known = np.array([(extra or {}).get(s, 0.0) for _, _, s, *_ in keep])
    d = Design(vcells, factors, known)
    if d.residual_df < 1:
        return None
    y = np.log([k[4] for k in keep])
    noise = pool_noise(d, [k[3] for k in keep])
    groups = [(c.arm, c.point) for c in vcells]
    if per_point and ex.per_point_supported(groups):
        # every arm holds enough servers at every point: each point's excess from its own cells
        d = Design(vcells, factors, known, per_point=True)
        theta, ok, _ = reml.fit_components(d, y, noise.v(d))
        choice = ex.ExcessChoice(ex.PER_POINT)
    else:
        d, theta, ok, choice = _shared_excess(
            vcells, factors, known, y, noise, ex.batch_blocks(groups) if per_point else ()
        )
    inf = Inference(d, noise, theta)
    beta = inf.C @ (inf.ViX.T @ y)
    out = Fit(d, y, noise, theta, beta, ok, _inference=inf, excess=choice)
    if not ok:
        out.warnings.append("variance model: the REML search did not report convergence; estimates are its best point")
    return out
