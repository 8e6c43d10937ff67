"""The one rule for comparing a committed results file with what the code computes now
(tests/test_results_rerender.py's summaries, tests/test_grid.py's grid.json): floats to REL
relative, every other value (verdicts, counts, warnings, keys, lengths) exactly."""

from __future__ import annotations

import math
from typing import Any

# The REML search (e2e/stats/variance_model.py) stops once a step moves the components by under 1e-6
# of the variance scale, so a component small beside that scale is fixed only to ~1e-4 of itself, and a
# numpy/scipy release moves where the search stops (measured: up to 6e-5 relative, 2026-12-04).
REL = 1e-3


def differs(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two JSON values differ, beyond REL for floats (one line per difference)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(a.keys() ^ b.keys())}"]
        return [d for k in a for d in differs(a[k], b[k], f"{path}/{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} against {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differs(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):
        return [] if math.isclose(a, b, rel_tol=REL, abs_tol=1e-12) else [f"{path}: {a!r} against {b!r}"]
    return [] if type(a) is type(b) and a == b else [f"{path}: {a!r} against {b!r}"]
