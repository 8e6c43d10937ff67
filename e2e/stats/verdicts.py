"""Between-arm comparisons of decode ms per token, and the decisions drawn from them. Pure, no I/O.

The model (docs/statistics/between-arms.md says it at length):

* One cell = one server at one depth; servers are the replicates, never requests. Across server
  starts the same setup moved by 16 % (CPU) to 0.2 % (H200), so the server's variance is estimated
  from the data, never assumed away.
* model_comparison: arm vs reference at one depth, from one fit of every server and depth of the
  run (e2e/stats/variance_model.py: a server's offset shared by the depths it serves, the cells' own
  robust noise, REML and Satterthwaite degrees of freedom). pooled_comparison is the same for two
  plain lists of cells (each its own server), as compare and the tests use it.
* Fewer than 2 servers in an arm at that depth: nothing is decided ("insufficient replication");
  a within-server interval is shown, labelled as such.
* Decision (decide): "slower"/"faster" iff p < alpha AND |ratio - 1| >= min_effect_pct / 100;
  "equivalent" iff the TOST p against +-log(1 + min_effect_pct / 100) is < alpha (the (1 - 2 alpha)
  interval lies inside the margin); else "inconclusive", never "no change". decide_family
  re-decides a whole family (every arm x depth) on Holm-adjusted p's.
* MDE (e2e/stats/planning.py): the smallest true change this rule calls with 80 % power, at the family's
  strictest step (alpha / m) and with the min-effect condition; always above min_effect.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

import numpy as np
from scipy import special

from e2e.design.point import Point
from e2e.errors import UserError
from e2e.stats import planning
from e2e.stats import variance_model as vm
from e2e.stats.bootstrap import percentile_ci
from e2e.stats.cells import LEVEL, SEED, CellStats

SLOWER, FASTER, EQUIVALENT, INCONCLUSIVE = "slower", "faster", "equivalent", "inconclusive"
INSUFFICIENT_REPLICATION, NODATA = "insufficient replication", "insufficient data"
# Set over the decision by the run's analysis where the arm's patch changed nothing at a point
# (e2e/rundir/patch_evidence.py); never drawn from the numbers.
INERT = "inert"
NOT_MEASURED_KV = "not measured (KV cache)"  # a point the server's KV cache cannot hold: skipped, not refused
VERDICTS = (SLOWER, FASTER, EQUIVALENT, INCONCLUSIVE, INSUFFICIENT_REPLICATION, NODATA, NOT_MEASURED_KV, INERT)


def read_inert(row: dict[str, Any], **evidence: Any) -> None:
    """A row whose arm is inert at its point reads inert, whatever the numbers say: the verdict they
    gave is kept as `decision_measured`, beside what showed the arm inert (`evidence`). The one rule
    for a run's report, compare and history."""
    row.update(decision_measured=row["decision"], decision=INERT, **evidence)


BETWEEN, WITHIN, WITHIN_ONE = "between-server", "within-server", "within-server (one server)"
METHODS = ("holm", "bonferroni", "none")


def t_quantile(p: float, df: float) -> float:
    return float(special.ndtri(p)) if df >= vm.MAX_DF else float(special.stdtrit(df, p))


def _tcdf(x: float, df: float) -> float:
    return float(special.ndtr(x)) if df >= vm.MAX_DF else float(special.stdtr(df, x))


def check_alpha(alpha: float) -> None:
    if not 0 < alpha < 0.5:
        raise UserError(f"alpha must be in (0, 0.5), got {alpha}")


# -- the comparison ---------------------------------------------------------------------------
@dataclass
class Comparison:
    """An arm against the reference at one depth. decision is None for per-pass rows (no test);
    decide_family fills p_adjusted / p_equiv_adjusted, the MDE, and re-decides."""

    ratio: float | None  # geometric-mean ratio arm / reference (> 1: arm slower)
    ci: tuple[float, float] | None
    ci_kind: str | None  # BETWEEN, WITHIN or None
    p: float | None  # two-sided t, before multiplicity
    p_equiv: float | None  # TOST against +-log(1 + min_effect), before multiplicity
    df: float | None  # Satterthwaite degrees of freedom of the log ratio's se
    se_log: float | None  # standard error of the log ratio
    n_ref: int
    n_arm: int
    model: str
    decision: str | None
    diff_ms: float | None  # arm - reference, ms per token (model means)
    diff_ci: tuple[float, float] | None
    alpha: float
    min_effect_pct: float
    level: float = LEVEL
    mde_pct: float | None = None  # the decision rule's MDE at the family's strictest step
    alpha_step: float | None = None  # that step (alpha / m)
    servers_needed: int | None = None  # servers per arm for an MDE <= target_mde_pct (planning)
    target_mde_pct: float | None = None
    decision_unadjusted: str | None = None
    p_adjusted: float | None = None
    p_equiv_adjusted: float | None = None
    correction: str | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def ci_half_width_pct(self) -> float | None:
        """(hi - lo) / 2 as % of the ratio."""
        if self.ci is None or not self.ratio:
            return None
        return 100 * (self.ci[1] - self.ci[0]) / 2 / self.ratio

    def to_dict(self) -> dict[str, Any]:
        lo, hi = self.ci or (None, None)
        dlo, dhi = self.diff_ci or (None, None)
        return {
            "ratio": self.ratio,
            "ratio_ci_lo": lo,
            "ratio_ci_hi": hi,
            "ci_kind": self.ci_kind,
            "ci_level": self.level,
            "ci_half_width_pct": self.ci_half_width_pct,
            "p_value": self.p,
            "p_adjusted": self.p_adjusted,
            "p_equiv": self.p_equiv,
            "p_equiv_adjusted": self.p_equiv_adjusted,
            "df": self.df,
            "se_log": self.se_log,
            "n_ref": self.n_ref,
            "n_arm": self.n_arm,
            "mde_pct": self.mde_pct,
            "alpha_step": self.alpha_step,
            "servers_needed": self.servers_needed,
            "target_mde_pct": self.target_mde_pct,
            "alpha": self.alpha,
            "min_effect_pct": self.min_effect_pct,
            "model": self.model,
            "diff_ms": self.diff_ms,
            "diff_ci_lo_ms": dlo,
            "diff_ci_hi_ms": dhi,
            "decision": self.decision,
            "decision_unadjusted": self.decision_unadjusted,
            "correction": self.correction,
            "warnings": list(self.warnings),
        }


class _Shared(TypedDict):
    """What every comparison of one test carries, whatever its outcome."""

    alpha: float
    min_effect_pct: float
    level: float
    n_ref: int
    n_arm: int


def decide(ratio: float | None, p: float | None, p_equiv: float | None, alpha: float, min_effect_pct: float) -> str:
    """The rule for ratio = arm / reference: see the module docstring. p None: no test."""
    if ratio is None:
        return NODATA
    if p is not None and p < alpha and abs(ratio - 1) * 100 >= min_effect_pct - 1e-9:
        return SLOWER if ratio > 1 else FASTER
    if min_effect_pct > 0 and p_equiv is not None and p_equiv < alpha:
        return EQUIVALENT
    return INCONCLUSIVE


def _check(alpha: float, min_effect_pct: float) -> None:
    check_alpha(alpha)
    if min_effect_pct < 0:
        raise UserError(f"min_effect_pct must be >= 0, got {min_effect_pct}")


def _within(ref: Sequence[CellStats], arm: Sequence[CellStats], base: _Shared, level: float) -> Comparison:
    """One server in an arm: what the cells' own robust noise says, never a decision."""
    er = [c.estimate for c in ref if c.estimate and c.estimate > 0]
    ea = [c.estimate for c in arm if c.estimate and c.estimate > 0]
    d = float(np.mean(np.log(ea)) - np.mean(np.log(er)))
    ratio, diff = math.exp(d), float(np.mean(ea) - np.mean(er))
    vr = [c.robust_log_var for c in ref if c.robust_log_var is not None]
    va = [c.robust_log_var for c in arm if c.robust_log_var is not None]
    ci = dci = se = None
    if vr and va:
        qz = t_quantile(0.5 + level / 2, math.inf)
        se = math.sqrt(float(np.mean(vr)) / len(er) + float(np.mean(va)) / len(ea))
        ci = (math.exp(d - qz * se), math.exp(d + qz * se))
        lse = math.sqrt(
            float(np.mean(vr)) * float(np.mean(np.square(er))) / len(er)
            + float(np.mean(va)) * float(np.mean(np.square(ea))) / len(ea)
        )
        dci = (diff - qz * lse, diff + qz * lse)
    return Comparison(
        ratio,
        ci,
        WITHIN if ci else None,
        None,
        None,
        None,
        se,
        decision=INSUFFICIENT_REPLICATION,
        diff_ms=diff,
        diff_ci=dci,
        model="one server in an arm: between-server variance unknown, no test; the interval is within-server only",
        warnings=[
            f"{min(len(er), len(ea))} server in an arm: at least 2 per arm are needed for a between-server comparison"
        ],
        **base,
    )


def model_comparison(
    fit: vm.Fit | None,
    arm: str,
    ref: str,
    point: Point,
    ref_cells: Sequence[CellStats],
    arm_cells: Sequence[CellStats],
    alpha: float,
    min_effect_pct: float,
    level: float = LEVEL,
) -> Comparison:
    """Arm vs reference at one point from the run's fit (see the module docstring); ref_cells and
    arm_cells are that point's cells (for the replication check and the within-server fallback).
    The decision is before multiplicity: run decide_family over every comparison of the run."""
    _check(alpha, min_effect_pct)
    kr = sum(1 for c in ref_cells if c.estimate and c.estimate > 0)
    ka = sum(1 for c in arm_cells if c.estimate and c.estimate > 0)
    base = _Shared(alpha=alpha, min_effect_pct=min_effect_pct, level=level, n_ref=kr, n_arm=ka)
    if kr == 0 or ka == 0:
        return Comparison(
            *(None,) * 7,
            model="none",
            decision=NODATA,
            diff_ms=None,
            diff_ci=None,
            warnings=["no cell with an estimate in one of the arms"],
            **base,
        )
    if kr < 2 or ka < 2 or fit is None:
        return _within(ref_cells, arm_cells, base, level)
    e = fit.contrast(arm, ref, point)
    ma, mr = fit.mean(arm, point), fit.mean(ref, point)
    cov = fit.covariance(arm, ref, point)
    if e is None or ma is None or mr is None or cov is None:
        return _within(ref_cells, arm_cells, base, level)  # the fit holds no cell of one side
    model = (
        f"one variance model over every server and depth ({fit.design.components}; REML, "
        "Satterthwaite degrees of freedom per comparison)"
    )
    out = Comparison(
        math.exp(e.value),
        None,
        BETWEEN,
        None,
        None,
        e.df,
        e.se,
        model=model,
        decision=INCONCLUSIVE,
        diff_ms=math.exp(ma.value) - math.exp(mr.value),
        diff_ci=None,
        warnings=list(fit.warnings),
        **base,
    )
    if e.se <= 1e-9:  # 1e-7 %: the fit's floor, not a measured variance
        out.warnings.append("zero variance between the servers and no noise within them: no test")
        return out
    _test(out, e, np.array([math.exp(ma.value), -math.exp(mr.value)]), cov)
    return out


def _test(out: Comparison, e: vm.Estimate, grad: np.ndarray, cov: np.ndarray) -> None:
    """The interval, the two-sided and the TOST p and the decision of a between-server comparison
    from its log-ratio estimate e (grad, cov: the ms difference's gradient and the means' covariance)."""
    assert out.ratio is not None and out.diff_ms is not None  # set by model_comparison
    q = t_quantile(0.5 + out.level / 2, e.df)
    dse = math.sqrt(max(float(grad @ cov @ grad), 0.0))
    out.diff_ci = (out.diff_ms - q * dse, out.diff_ms + q * dse)
    out.ci = (math.exp(e.value - q * e.se), math.exp(e.value + q * e.se))
    out.p = 2 * _tcdf(-abs(e.value) / e.se, e.df)
    if out.min_effect_pct > 0:
        m = math.log1p(out.min_effect_pct / 100)
        out.p_equiv = max(_tcdf(-(e.value + m) / e.se, e.df), _tcdf((e.value - m) / e.se, e.df))
    out.decision = decide(out.ratio, out.p, out.p_equiv, out.alpha, out.min_effect_pct)


def pooled_comparison(
    ref: Sequence[CellStats], arm: Sequence[CellStats], alpha: float, min_effect_pct: float, level: float = LEVEL
) -> Comparison:
    """Two plain lists of cells at one depth, each cell its own server (the model in fresh mode)."""
    one = Point(1)
    cells = [("ref", one, f"r{i}", c) for i, c in enumerate(ref)] + [
        ("arm", one, f"a{i}", c) for i, c in enumerate(arm)
    ]
    return model_comparison(vm.fit(cells), "arm", "ref", one, ref, arm, alpha, min_effect_pct, level)


def within_server_ratio(
    ref: CellStats, arm: CellStats, alpha: float, min_effect_pct: float, level: float = LEVEL, seed: int = SEED
) -> Comparison:
    """One pass: the two cells' servers only. Ratio and the percentile interval of the ratio of
    independent bootstrap replicates; no test and no decision (decision None): the interval knows
    nothing of between-server variance."""
    model = "per pass: the two servers only, bootstrap ratio interval (within-server); no decision"

    def row(
        ratio: float | None,
        ci: tuple[float, float] | None,
        kind: str | None,
        n: int,
        diff: float | None,
        diff_ci: tuple[float, float] | None,
        warnings: list[str],
    ) -> Comparison:
        return Comparison(
            ratio,
            ci,
            kind,
            p=None,
            p_equiv=None,
            df=None,
            se_log=None,
            n_ref=n,
            n_arm=n,
            model=model,
            decision=None,
            diff_ms=diff,
            diff_ci=diff_ci,
            alpha=alpha,
            min_effect_pct=min_effect_pct,
            level=level,
            warnings=warnings,
        )

    if ref.estimate is None or arm.estimate is None or ref.estimate <= 0 or arm.estimate <= 0:
        return row(None, None, None, 0, None, None, ["no estimate in one of the two cells"])
    ratio, diff = arm.estimate / ref.estimate, arm.estimate - ref.estimate
    if ref.boot.size == 0 or arm.boot.size == 0:
        return row(ratio, None, None, 1, diff, None, ["no interval: too few rounds in a cell"])
    rng = np.random.default_rng(seed + 1)
    n = min(ref.boot.size, arm.boot.size)
    rb, ab = rng.choice(ref.boot, n), rng.choice(arm.boot, n)
    keep = rb > 0
    return row(ratio, percentile_ci(ab[keep] / rb[keep], level), WITHIN, 1, diff, percentile_ci(ab - rb, level), [])


# -- the family -------------------------------------------------------------------------------
def adjust(p: Sequence[float], method: str = "holm") -> list[float]:
    """Family-wise adjusted p-values: Holm's step-down, Bonferroni, or none."""
    if method not in METHODS:
        raise UserError(f"unknown multiplicity method {method!r} (one of {', '.join(METHODS)})")
    m = len(p)
    if method == "none" or m == 0:
        return [float(x) for x in p]
    if method == "bonferroni":
        return [min(1.0, m * float(x)) for x in p]
    order = np.argsort(p, kind="stable")
    out, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(p[i])))
        out[int(i)] = running
    return out


def family_step(m: int, alpha: float, method: str = "holm") -> float:
    """The strictest per-comparison alpha of the family's correction (Holm's and Bonferroni's
    first step alpha / m): the planning figures use it, so they hold whatever the others do."""
    return alpha / m if method != "none" and m else alpha


def decide_family(comparisons: Sequence[Comparison], alpha: float, method: str = "holm") -> str:
    """Adjust the family's p's (every comparison with a between-server test; the two-sided and the
    equivalence p's separately), re-decide each on the adjusted p's, set each one's MDE at the
    family's strictest step, and return one line saying what was done. Comparisons without a test
    keep their decision; per-pass rows (None) too."""
    check_alpha(alpha)
    tested = [(c, c.p) for c in comparisons if c.decision is not None and c.p is not None]
    equiv = [(c, c.p_equiv) for c, _ in tested if c.p_equiv is not None]
    for (c, _), pa in zip(tested, adjust([p for _, p in tested], method)):
        c.p_adjusted = pa
    for (c, _), pe in zip(equiv, adjust([p for _, p in equiv], method)):
        c.p_equiv_adjusted = pe
    fam = [c for c, _ in tested]
    m = len(fam)
    step = family_step(m, alpha, method)
    name = {"holm": "Holm step-down", "bonferroni": "Bonferroni", "none": "no correction"}[method]
    line = (
        f"{name} over {m} comparison(s) (arm x depth) at family-wise alpha {alpha:g}, "
        "separately for the difference and the equivalence tests"
        if m
        else "no comparison with 2 or more servers per arm: nothing to correct"
    )
    for c in fam:
        if c.decision_unadjusted is None:
            c.decision_unadjusted = c.decision
        c.alpha, c.alpha_step = alpha, step
        c.decision = decide(c.ratio, c.p_adjusted, c.p_equiv_adjusted, alpha, c.min_effect_pct)
        c.mde_pct = planning.mde_pct(c.se_log, c.df, step, c.min_effect_pct) if c.se_log and c.df is not None else None
        c.correction = line
        inconclusive_note(c)
    return line


def inconclusive_note(c: Comparison) -> None:
    """The warning an inconclusive comparison carries: what the design could resolve, and what
    would (servers_needed, when planning filled it in). Said once, however often it is re-decided."""
    c.warnings = [w for w in c.warnings if not w.startswith("inconclusive:")]
    if c.decision == INCONCLUSIVE and c.ratio and c.ci and c.p_adjusted is not None and c.p_adjusted < c.alpha:
        lo, hi = (100 * (x - 1) for x in c.ci)  # a real change, too small to count: not a lack of power
        c.warnings.append(
            f"inconclusive: {100 * (c.ratio - 1):+.1f} % ({lo:.1f} to {hi:.1f}), below the "
            f"{c.min_effect_pct:g} % minimum effect (significant, but not shown within +-{c.min_effect_pct:g} %)"
        )
        return
    if c.decision != INCONCLUSIVE or c.mde_pct is None:
        return
    need = ""
    if c.target_mde_pct is not None:
        need = (
            f"; {c.servers_needed} servers per arm would bring it to {c.target_mde_pct:g} %"
            if c.servers_needed
            else f"; more than {planning.MAX_PLAN_SERVERS} servers per arm would be needed for {c.target_mde_pct:g} %"
        )
    c.warnings.append(
        f"inconclusive: with {c.n_ref} + {c.n_arm} servers only changes of about "
        f"{c.mde_pct:.1f} % or more are called with 80 % power{need}"
    )
