"""A run folder's rows -> tables (RunAnalysis), the dry run's prediction (prior), adaptive replication's decision.

The face: `__all__` names the modules other stages may import; the others are this stage's own
(tests/test_layers.py holds every import from outside the package to it)."""

__all__ = ["adaptive", "prior", "run_analysis"]
