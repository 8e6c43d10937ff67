"""The bookend test's false-alarm rate by simulation, through the functions a run uses
(e2e/stats/bookends.py: step_p, flagged). Prints a markdown table:

    python -m e2e.validation.conformance_bookends [--experiments N] [--alpha A] [--min-step-pct S]

(`python -m e2e.stats.bookends`, the command the committed reports name, runs this.)
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from e2e.stats.bookends import TEST, flagged, step_p

# -- the false-alarm rate, by simulation through the functions above ---------------------------------
DESIGNS = [  # (label, opening rounds, closing rounds, noise CV, outlier share, AR(1) rho, true step)
    ("stationary, CV 2 %", 10, 5, 0.02, 0.0, 0.0, 0.0),
    ("stationary, CV 5 %", 6, 5, 0.05, 0.0, 0.0, 0.0),
    ("stationary, CV 5 %, 10 % outlier rounds (+30 %)", 6, 5, 0.05, 0.10, 0.0, 0.0),
    ("stationary, CV 2 %", 5, 5, 0.02, 0.0, 0.0, 0.0),
    ("drifting: AR(1) rho 0.5, CV 2 %", 10, 5, 0.02, 0.0, 0.5, 0.0),
    ("step 2.4 % (issue 23's neighbour), CV 1 %", 10, 5, 0.01, 0.0, 0.0, 2.4),
    ("step 5 %, CV 2 %", 6, 5, 0.02, 0.0, 0.0, 5.0),
    ("step 30 % (the CPU test's injected delay), CV 5 %", 6, 5, 0.05, 0.0, 0.0, 30.0),
]


def simulate_rates(
    n_open: int,
    n_close: int,
    cv: float,
    outliers: float,
    rho: float,
    step_pct: float,
    n: int,
    alpha: float,
    min_step_pct: float,
    seed: int = 0,
) -> dict[str, float]:
    """Share of n simulated servers whose bookend is p < alpha, and flagged non-stationary."""
    rng = np.random.default_rng(seed)
    k = n_open + n_close
    z = rng.normal(0, 1, (n, k))
    for j in range(1, k):  # AR(1) with unit marginal variance
        z[:, j] = rho * z[:, j - 1] + np.sqrt(1 - rho**2) * z[:, j]
    x = 10.0 * np.exp(cv * z) * np.where(rng.random((n, k)) < outliers, 1.3, 1.0)
    x[:, n_open:] *= 1 + step_pct / 100
    p, step = step_p(x[:, :n_open], x[:, n_open:])
    return {"p_below_alpha": float((p < alpha).mean()), "flagged": float(flagged(p, step, alpha, min_step_pct).mean())}


def conformance(n: int = 2000, alpha: float = 0.01, min_step_pct: float = 1.0) -> list[dict[str, Any]]:
    rows = []
    for i, (label, n1, n2, cv, out, rho, step) in enumerate(DESIGNS):
        r = simulate_rates(n1, n2, cv, out, rho, step, n, alpha, min_step_pct, seed=i)
        null = step == 0 and rho == 0
        rows.append(
            {
                "design": label,
                "opening": n1,
                "closing": n2,
                "step_pct": step,
                **r,
                "target": f"<= {100 * alpha:g} % (+3 MC se)" if null else "-",
                "met": (r["flagged"] <= alpha + 3 * np.sqrt(alpha * (1 - alpha) / n)) if null else None,
                "n": n,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m e2e.validation.conformance_bookends", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--experiments", type=int, default=20000)
    ap.add_argument("--alpha", type=float, default=0.01)
    ap.add_argument("--min-step-pct", type=float, default=1.0)
    a = ap.parse_args(argv)
    print(
        f"| design | opening / closing rounds | p < {a.alpha:g} | flagged (and step >= {a.min_step_pct:g} % either way) "
        "| target | met |\n|---|---|---|---|---|---|"
    )
    for r in conformance(a.experiments, a.alpha, a.min_step_pct):
        met = "-" if r["met"] is None else ("yes" if r["met"] else "NO")
        print(
            f"| {r['design']} | {r['opening']} / {r['closing']} | {100 * r['p_below_alpha']:.2f} % | "
            f"{100 * r['flagged']:.2f} % | {r['target']} | {met} |"
        )
    print(f"({a.experiments} simulated servers per design; {TEST})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
