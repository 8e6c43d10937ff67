"""Command line: argv -> a subcommand -> an exit status (`entry.main`, the subcommand table in `commands`).

The face: `__all__` names the modules other stages may import; the others are this stage's own
(tests/guarantees/test_layers.py holds every import from outside the package to it)."""

from e2e.cli.entry import main

__all__ = ["main"]
