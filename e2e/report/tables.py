"""Every table, CSV and figure the tools write goes through here: one number formatter; a table
declared once as columns (Col, Table) and rendered as markdown, CSV (with its schema version) or a
console table; one figure saver (report, compare, history, gsm8k, kernels_check, the console).
The tables of a run's summary are declared in e2e/report/summary.py. Files are written to a new name and
renamed into place (e2e/safety/safe_io.py): never written through a link, never left half-written."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.safety.safe_io import atomic_writer

MISSING = "-"

# The views a column shows in: report.md, the console, both; a CSV-only column has none.
MD, CONSOLE, CSV_ONLY = frozenset({"md"}), frozenset({"console"}), frozenset[str]()
BOTH = MD | CONSOLE


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


# -- a table declared once -----------------------------------------------------------------------
Row = dict[str, Any]


@dataclass(frozen=True)
class Col:
    """One column: its header, how a row shows in it, the row fields it writes to the CSV, and the
    views that show it ("md" unless told; a table's own view names, "console")."""

    head: str | None  # None: a CSV-only column; may hold {ctx} fields
    show: Callable[[Row], Any] | None = None
    csv: tuple[str, ...] = ()
    views: frozenset[str] = frozenset({"md"})
    colour: Callable[[Row], str | None] | None = None  # console colour of the cell (a verdict's)
    from_row: bool = False  # copied as is from the source row (e2e/report/summary.py)
    # a CSV column written only when some row carries the field (a run's concurrency: batch-1 runs,
    # whose rows have none, keep the CSV they always had)
    optional: bool = False


def col(key: str, head: str | None, fmt: str | None = "{:.2f}", views: Iterable[str] = ("md",), **kw: Any) -> Col:
    """The common column: one field, shown with num(fmt) (or as text when fmt is None)."""
    show = (lambda r: text(r.get(key))) if fmt is None else (lambda r: num(r.get(key), fmt))
    return Col(head, show, (key,), frozenset(views), **kw)


def text(x: Any) -> str:
    return MISSING if x is None or x == "" else str(x)


@dataclass(frozen=True)
class Table:
    name: str
    cols: tuple[Col, ...]

    def view(self, name: str) -> list[Col]:
        return [c for c in self.cols if c.head is not None and name in c.views]

    def csv_fields(self) -> list[str]:
        return list(dict.fromkeys(k for c in self.cols for k in c.csv))

    def row_fields(self) -> list[str]:
        return [k for c in self.cols if c.from_row for k in c.csv]


def _head(c: Col, ctx: dict[str, Any]) -> str:
    return (c.head or "").format(**ctx)


def _show(c: Col, r: Row) -> Any:
    return c.show(r) if c.show else MISSING


def render_markdown(t: Table, rows: Iterable[Row], view: str = "md", **ctx: Any) -> str:
    cols = t.view(view)
    return markdown([_head(c, ctx) for c in cols], [[_show(c, r) for c in cols] for r in rows])


def render_console(t: Table, rows: Iterable[Row], title: str | None = None, view: str = "console", **ctx: Any) -> Any:
    """A rich table of the view (cells as plain text: no markup is read from the data)."""
    from rich.table import Table as RichTable
    from rich.text import Text

    cols = t.view(view)
    out = RichTable(title=title)
    for c in cols:
        out.add_column(_head(c, ctx))
    for r in rows:
        out.add_row(*[Text(str(_show(c, r)), style=(c.colour(r) or "") if c.colour else "") for c in cols])
    return out


def write_table_csv(path: Path, t: Table, rows: Iterable[Row], version: int) -> Path:
    rows = list(rows)
    optional = {k for c in t.cols if c.optional for k in c.csv}
    fields = [k for k in t.csv_fields() if k not in optional or any(k in r for r in rows)]
    return write_csv(path, rows, fields, version)


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
            w.writerow(
                {
                    "schema_version": version,
                    **{k: (json.dumps(v) if isinstance(v, (list, dict)) else v) for k, v in r.items()},
                }
            )
    return path


def new_figure(width: float = 7, height: float = 4.5) -> tuple[Any, Any]:
    """A matplotlib figure and axes on the headless backend (no display anywhere we run)."""
    fig, (ax,) = new_panels(width, height)
    return fig, ax


def new_panels(width: float, height: float, nrows: int = 1, ncols: int = 1) -> tuple[Any, list[Any]]:
    """A figure of nrows x ncols panels, each with its own scale; the axes as one flat list."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False)
    return fig, [ax for row in axes for ax in row]


def save_figure(fig: Any, path: Path, dpi: int = 120, layout: bool = True) -> Path:
    """layout=False: the caller laid the figure out itself (a legend of the whole figure, say)."""
    import matplotlib.pyplot as plt

    if layout:
        fig.tight_layout()
    try:
        with atomic_writer(path) as f:
            fig.savefig(f, dpi=dpi, format=Path(path).suffix.lstrip(".") or "png")
    finally:
        plt.close(fig)
    return path
