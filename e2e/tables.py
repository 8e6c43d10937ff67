"""Every table, CSV and figure the tools write goes through here: one number formatter, one
markdown table, one CSV-with-schema writer, one figure saver (report, compare, history, gsm8k,
kernels_check, progress). Files are written to a new name and renamed into place (e2e/safe_io.py):
never written through a link, never left half-written."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any, Iterable, Sequence

from e2e.safe_io import atomic_writer

MISSING = "-"


def num(x: Any, fmt: str = "{:.2f}") -> str:
    """A number for a table; "-" for None or NaN. fmt is a str.format pattern ("{:.3f}")."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return MISSING
    return fmt.format(x)


def pct(fraction: Any, fmt: str = "{:.1f}") -> str:
    """A fraction shown as a percentage (0.123 -> "12.3")."""
    return MISSING if fraction is None else fmt.format(100 * fraction)


def interval(lo: Any, hi: Any, fmt: str = "{:.2f}", sep: str = " to ") -> str:
    return MISSING if lo is None or hi is None else f"{fmt.format(lo)}{sep}{fmt.format(hi)}"


def markdown(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def write_csv(path: Path, rows: Iterable[dict[str, Any]], cols: Sequence[str], version: int) -> Path:
    """A CSV whose first column is schema_version; lists and dicts are written as JSON."""
    with atomic_writer(path, text=True) as f:
        w = csv.DictWriter(f, fieldnames=["schema_version", *cols], extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({"schema_version": version,
                        **{k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in r.items()}})
    return path


def new_figure(width: float = 7, height: float = 4.5) -> tuple[Any, Any]:
    """A matplotlib figure and axes on the headless backend (no display anywhere we run)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height))


def save_figure(fig: Any, path: Path, dpi: int = 120) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    try:
        with atomic_writer(path) as f:
            fig.savefig(f, dpi=dpi, format=Path(path).suffix.lstrip(".") or "png")
    finally:
        plt.close(fig)
    return path
