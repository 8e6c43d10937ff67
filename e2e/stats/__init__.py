"""Numbers in, numbers out, no I/O: per-cell statistics, the estimator, the variance model, verdicts, planning, change points, bookends, the sign-off, result words, the stall check of a round at c > 1 (their conformance by simulation: e2e/validation/).

The face: `__all__` names the modules other stages may import; the others are this stage's own
(tests/guarantees/test_layers.py holds every import from outside the package to it)."""

__all__ = [
    "bookends",
    "cells",
    "changepoints",
    "estimate",
    "one_arm",
    "outcomes",
    "planning",
    "prefill_guard",
    "run_to_run",
    "signoff",
    "stall",
    "variance_model",
    "verdicts",
]
