"""How long the change-point search takes on long synthetic series (not a test: a timing to read).

    python -m e2e.validation.bench_changepoints            # 100, 300 and 1000 runs
    python -m e2e.validation.bench_changepoints 2000       # other lengths

Each series: 2 servers a run, run-to-run sd 0.5 %, server sd 0.5 %, a 4 % step up a third of the
way in and back down at two thirds; the search as `history` runs it (judge_series: the steps and
how each stretch between them held). Prints the seconds and what it found.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from e2e.stats.changepoints import judge_series

SERVERS, RUN_SD, SERVER_SD, STEP = 2, 0.005, 0.005, 0.04


def series(n: int, seed: int = 0) -> list[list[float]]:
    """n runs of log estimates with a step up at n // 3 and back down at 2 n // 3."""
    rng = np.random.default_rng([seed, n])
    level = [STEP if n // 3 <= i < 2 * n // 3 else 0.0 for i in range(n)]
    return [list(np.log(10.0) + lv + rng.normal(0, RUN_SD) + rng.normal(0, SERVER_SD, SERVERS)) for lv in level]


def main(argv: list[str] | None = None) -> int:
    sizes = [int(x) for x in (sys.argv[1:] if argv is None else argv)] or [100, 300, 1000]
    print(f"{'runs':>6} {'seconds':>8}  found")
    for n in sizes:
        runs = series(n)
        t0 = time.perf_counter()
        res = judge_series(runs, 0.05, 2.0)
        dt = time.perf_counter() - t0
        steps = ", ".join(f"{c.decision} at run {c.index} (ratio {c.ratio:.3f})" for c in res.steps) or "no step"
        print(
            f"{n:>6} {dt:>8.2f}  {steps}; between the steps: {', '.join(s.decision for s in res.stretches)}", flush=True
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
