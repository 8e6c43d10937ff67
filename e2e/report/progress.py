"""Progress on the terminal (rich): cell n of N, the phase, an ETA, a line per finished cell. (The
tables at the end of a run are the summary's: e2e/report/answer.py.) Every line here carries data
(arm and cell names, paths, errors): it is printed as text, never read as rich markup."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TaskID, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress
from rich.text import Text

from e2e.report.tables import num


def make_console(stderr: bool = False) -> Console:
    """A rich console. Written to a file or pipe (CI logs, `2>run.log`) rich assumes 80 columns and
    truncates table cells; use 160 there so the cell table stays readable."""
    console = Console(stderr=stderr)
    return console if console.is_terminal else Console(stderr=stderr, width=160)


def say(console: Console, line: str, style: str | None = None) -> None:
    """One line that holds data (a name, a path, an error) on the console: printed as it is, so a
    `[` in it is never read as markup (rich.markup.escape where a line mixes both)."""
    console.print(Text(line, style=style or ""))


class Progress:
    def __init__(self, console: Console | None = None, enabled: bool = True):
        self.console = console or make_console(stderr=True)
        self.enabled = enabled
        self._bar: RichProgress | None = None
        self._task: TaskID | None = None
        self._total = 0

    def start(self, total: int, done: int) -> None:
        self._total = total
        if not self.enabled:
            return
        self._bar = RichProgress(
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self._bar.start()
        self._task = self._bar.add_task("starting", total=total, completed=done)

    def phase(self, cell: Any, phase: str) -> None:
        text = f"cell {cell.index + 1}/{self._total} {cell.cell_id}: {phase}"
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, description=text)
        else:  # plain mode: one line per phase (logs, CI, and the interrupt tests read these)
            say(self.console, text)

    def note(self, text: str) -> None:
        say(self.console, text)

    def cell_done(self, cell: Any, row: Mapping[str, Any]) -> None:
        msg = (
            f"{row['cell_id']}: {row['status']}  start {num(row.get('startup_s'), '{:.1f}')} s  "
            f"warm {num(row.get('warmup_s'), '{:.1f}')} s  measure {num(row.get('measure_s'), '{:.1f}')} s  "
            f"decode {num(row.get('decode_ms_per_token'))} ms/tok  "
            f"overhead {num(row.get('client_overhead_ms_median'), '{:.3f}')} ms/req"
        )
        if row["status"] != "ok":
            msg += f"  error: {row.get('error')}"
        say(self.console, msg)
        if self._bar is not None and self._task is not None:
            self._bar.advance(self._task)

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
