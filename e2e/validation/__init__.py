"""The validation wing: the statistics checked by simulation through the code a run executes. The
conformance tables (`python -m e2e.validation.conformance`, `_adaptive`, `_grid`, `_guard`, `_runs`,
`_bookends`), the simulated runs and server timings they judge, and the change-point search's timing
(`python -m e2e.validation.bench_changepoints`). It stands above analysis/ so that it imports the
rules a run uses (analysis/comparisons.py, analysis/run_prior.py) instead of copying them; nothing
a run executes imports it.

The face: `__all__` names the modules other stages may import; the others are this stage's own
(tests/guarantees/test_layers.py holds every import from outside the package to it)."""

__all__ = [
    "bench_changepoints",
    "conformance",
    "conformance_adaptive",
    "conformance_bookends",
    "conformance_figures",
    "conformance_grid",
    "conformance_guard",
    "conformance_runs",
    "sim_grid",
    "sim_server_timings",
    "simulation",
]
