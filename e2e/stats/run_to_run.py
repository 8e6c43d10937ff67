"""Run-to-run variation where it cannot be measured: one run stands for each side. Pure, no I/O.

Two runs of the same software on two days differ by more than their servers do (another machine
state, another lease). Within a run the variance model sees only its servers; between two runs the
difference of an arm's level carries each run's own offset too. Where a side holds several runs
(a history's stretch) that offset is a random factor of the fit (e2e/stats/changepoints.py); where
each side is one run (`compare`, a two-run history) it cannot be estimated, and a stated prior
(RunSd, measured by e2e/analysis/run_prior.py) stands in:

* an arm's level varies from run to run by sd_level (the reference arm's per-run spread) and, for
  any other arm, also by sd_ratio (the spread of its ratio to the reference across runs: an arm x
  run interaction), so sd(arm) = sqrt(sd_level^2 + sd_ratio^2), the reference's sd_level alone;
* a contrast of one run against another adds 2 sd(arm)^2 to its log variance (one offset a side);
  the prior is taken as known: Satterthwaite's df of the sum counts only the fit's part;
* the interval, both tests and the decision are recomputed on the widened variance (widen), with
  the same rule (verdicts.decide) and before the family's multiplicity step.

A point the prior does not list takes the largest sd the prior holds (the prior was measured at
batch 1 on one GPU; elsewhere it is a stated assumption, and the console says so).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from scipy import special

from e2e.design.point import Point
from e2e.stats import variance_model as vm
from e2e.stats.cells import CellStats
from e2e.stats.verdicts import BETWEEN, Comparison, decide, decide_family, model_comparison, t_quantile


@dataclass(frozen=True)
class RunSd:
    """The run-to-run sd (log scale, a fraction) per point: of the reference arm's level, and of
    another arm's ratio to it. `other`: (level, ratio) at a point not listed (None: the largest
    listed). `source` names where it came from."""

    level: Mapping[Point, float]
    ratio: Mapping[Point, float] = field(default_factory=dict)
    source: str = "stated"
    other: tuple[float, float] | None = None

    @classmethod
    def flat(cls, sd: float, source: str) -> RunSd:
        """One sd for every arm at every point (an override: --run-sd, stats.run_sd_pct)."""
        return cls({}, {}, source, (sd, 0.0))

    def sd(self, point: Point, reference: bool) -> float:
        lo, ro = self.other or (max(self.level.values(), default=0.0), max(self.ratio.values(), default=0.0))
        lv = self.level.get(point, lo)
        rt = 0.0 if reference else self.ratio.get(point, ro)
        return math.sqrt(lv * lv + rt * rt)

    @property
    def off(self) -> bool:
        return not any(self.level.values()) and not any(self.ratio.values()) and not any(self.other or ())

    def span_pct(self) -> str:
        """The sds it holds, as a console line quotes them ("0.09-0.23 %")."""
        vals = [100 * self.sd(p, r) for p in (list(self.level) or [Point(0)]) for r in (True, False)]
        lo, hi = min(vals), max(vals)
        return f"{lo:.2g} %" if f"{lo:.2g}" == f"{hi:.2g}" else f"{lo:.2g}-{hi:.2g} %"


def widen(c: Comparison, extra_var: float, level_ms: float | None = None) -> Comparison:
    """The comparison with extra_var added to its log variance (taken as known), re-tested and
    re-decided before multiplicity; level_ms (the reference level) widens the ms difference alike.
    A comparison without a between-server test is returned as it is."""
    if extra_var <= 0 or c.ci_kind != BETWEEN or c.se_log is None or c.df is None or not c.ratio or c.p is None:
        return c
    var0 = c.se_log**2
    var = var0 + extra_var
    df = vm.MAX_DF if var0 <= 0 else min(vm.MAX_DF, max(c.df, var * var / (var0 * var0 / c.df)))
    se, lr = math.sqrt(var), math.log(c.ratio)
    q0, q = t_quantile(0.5 + c.level / 2, c.df), t_quantile(0.5 + c.level / 2, df)
    c.ci = (math.exp(lr - q * se), math.exp(lr + q * se))
    if c.diff_ci is not None and c.diff_ms is not None and level_ms:
        dse = math.hypot((c.diff_ci[1] - c.diff_ci[0]) / 2 / q0, level_ms * math.sqrt(extra_var))
        c.diff_ci = (c.diff_ms - q * dse, c.diff_ms + q * dse)
    c.se_log, c.df = se, df
    c.p = 2 * _tcdf(-abs(lr) / se, df)
    if c.min_effect_pct > 0:
        m = math.log1p(c.min_effect_pct / 100)
        c.p_equiv = max(_tcdf(-(lr + m) / se, df), _tcdf((lr - m) / se, df))
    c.decision = decide(c.ratio, c.p, c.p_equiv, c.alpha, c.min_effect_pct)
    c.model += f"; plus a run-to-run sd of {100 * math.sqrt(extra_var / 2):.2g} % a side, assumed"
    return c


def _tcdf(x: float, df: float) -> float:
    return float(special.ndtr(x)) if df >= vm.MAX_DF else float(special.stdtr(df, x))


def between_runs(c: Comparison, run_sd: RunSd | None, point: Point, reference: bool, level_ms: float | None) -> float:
    """Widen a comparison of one run against another (one run a side) by the prior's sd for this
    arm and point; the sd applied (0: none)."""
    sd = run_sd.sd(point, reference) if run_sd is not None else 0.0
    widen(c, 2 * sd * sd, level_ms)
    return sd if c.ci_kind == BETWEEN and c.p is not None else 0.0


@dataclass
class Between:
    """One arm at one point of a comparison of run B against run A."""

    arm: str
    point: Point
    a: list[CellStats]
    b: list[CellStats]
    comparison: Comparison
    run_sd: float  # the sd it was widened by (0: none)


SimpleCell = tuple[str, Point, str, CellStats]  # (arm, point, server, its statistics)


def two_runs(
    a: Sequence[SimpleCell],
    b: Sequence[SimpleCell],
    arms: Sequence[str],
    points: Sequence[Point],
    reference: str | None,
    alpha: float,
    min_effect_pct: float,
    run_sd: RunSd | None,
) -> tuple[vm.Fit | None, list[Between], str]:
    """Run B against run A, as `compare` decides it: one variance model over both runs' servers
    (each run's arm a group "A:arm" / "B:arm", its servers "A:..." / "B:..."), each arm x point's
    B/A contrast widened by run_sd (one run a side), Holm over the family. (fit, rows, the
    correction line)."""
    fit = vm.fit([(f"{tag}:{x}", p, f"{tag}:{s}", c) for tag, run in (("A", a), ("B", b)) for x, p, s, c in run])
    out = []
    for arm in arms:
        for p in points:
            ca = [c for x, q, _, c in a if x == arm and q == p]
            cb = [c for x, q, _, c in b if x == arm and q == p]
            cmp = model_comparison(fit, f"B:{arm}", f"A:{arm}", p, ca, cb, alpha, min_effect_pct)
            m = fit.mean(f"A:{arm}", p) if fit is not None else None
            ok = [math.log(c.estimate) for c in ca if c.estimate and c.estimate > 0]
            level_ms = math.exp(m.value) if m is not None else math.exp(sum(ok) / len(ok)) if ok else None
            out.append(Between(arm, p, ca, cb, cmp, between_runs(cmp, run_sd, p, arm == reference, level_ms)))
    return fit, out, decide_family([x.comparison for x in out], alpha, "holm")
