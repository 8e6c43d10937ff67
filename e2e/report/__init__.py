"""Rendering: the summary model, report.md, CSVs, figures, compare, history, the console's progress.

The face: `__all__` names the modules other stages may import; the others are this stage's own
(tests/guarantees/test_layers.py holds every import from outside the package to it)."""

__all__ = [
    "answer",
    "compare",
    "figures",
    "grid",
    "history",
    "pr_block",
    "progress",
    "report_md",
    "summary",
    "tables",
    "write",
]
