"""The figures of the conformance table (e2e/validation/conformance.py): a rate with its Monte-Carlo
interval and its target."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from e2e.stats import signoff
from e2e.stats import verdicts as v
from e2e.validation.simulation import SEED


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


def markdown(figs: list[Figure]) -> str:
    def pct(x: float) -> str:
        return f"{100 * x:.1f} %"

    lines = ["| figure | design | value | MC 95 % interval | target | met |", "|---|---|---|---|---|---|"]
    for f in figs:
        val = f"{f.value:.2f} %" if "MDE" in f.what else f"{f.value:.2f}" if "count" in f.what else pct(f.value)
        iv = f.interval
        lines.append(
            f"| {f.what} | {f.design} | {val} | "
            f"{f'{pct(iv[0])} to {pct(iv[1])} (n {f.n})' if iv else '-'} | {f.target or '-'} | "
            f"{'-' if f.ok is None else 'yes' if f.ok else '**no**'} |"
        )
    return "\n".join(lines)


def _experiments(text: str) -> int:
    n = int(text)
    if n < 10:
        raise argparse.ArgumentTypeError(f"{n}: want at least 10 experiments per design")
    return n


def table_main(
    prog: str,
    doc: str | None,
    run: Callable[[int, int], list[Figure]],
    default_n: int,
    argv: Sequence[str] | None,
    echo: Callable[[str], None],
) -> int:
    """The command line of every conformance table: --experiments (>= 10) and --seed, the table
    printed as markdown; 1 when a row misses its target."""
    ap = argparse.ArgumentParser(prog=prog, description=(doc or "").split("\n\n")[0])
    ap.add_argument(
        "--experiments", type=_experiments, default=default_n, help="per design (default %(default)s, >= 10)"
    )
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args(argv)
    figs = run(args.experiments, args.seed)
    echo(markdown(figs))
    return 1 if any(f.ok is False for f in figs) else 0
