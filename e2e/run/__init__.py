"""A run folder's life and its cells: the session, the run loop, a cell's requests and /metrics, the executors (local, Ray).

The face: `__all__` names the modules other stages may import; the others are this stage's own
(tests/guarantees/test_layers.py holds every import from outside the package to it)."""

__all__ = ["executors", "preflight", "session"]
