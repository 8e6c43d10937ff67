"""Kernel profiles: what a decode step runs, per arm and point, from vLLM's own torch profiler.

groups.py names kernels' groups (the one table), trace.py reads a chrome trace, steps.py differences
the long and short rounds into per-decode-step figures and attributes arm differences, capture.py
runs the profiled rounds against a server (configured by e2e/serve/profiler_args.py)."""

__all__ = ["capture", "section", "steps"]
