"""A run folder's rows -> tables (RunAnalysis, from a RunRecord: run_folder), the manifest's facts as a report
states them, the dry run's prediction (prior), adaptive replication's decision.

The face: `__all__` names the modules other stages may import; the others are this stage's own
(tests/guarantees/test_layers.py holds every import from outside the package to it)."""

__all__ = ["adaptive", "comparisons", "manifest_facts", "prior", "run_analysis", "run_folder", "run_prior"]
