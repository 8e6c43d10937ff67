"""What a run will do, before anything starts: the config (TOML -> frozen, validated objects), the design point (depth, concurrency), the defaults several stages state, and the plan (cells in counterbalanced order). Pure, no I/O beyond reading the config.

The face: `__all__` names the modules other stages may import; the others are this stage's own
(tests/guarantees/test_layers.py holds every import from outside the package to it)."""

__all__ = ["config", "defaults", "plan", "point"]
