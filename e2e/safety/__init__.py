"""What keeps a run safe to interrupt and its files safe to share: secrets redacted, writes by rename into a closed folder, Ctrl-C held during teardown, no read of a server or a tool unbounded.

The face: `__all__` names the modules other stages may import; the others are this stage's own
(tests/guarantees/test_layers.py holds every import from outside the package to it)."""

__all__ = ["bounded_run", "http_read", "interrupts", "redact", "safe_io"]
