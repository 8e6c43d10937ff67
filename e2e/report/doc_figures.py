"""Figures the docs quote from committed runs, each recomputed from its run folder.

A doc writer marks a number (or a short phrase of numbers) where it is quoted:

    FA3 read <!-- fig:load32k.fa3.c1 -->11.33<!-- /fig --> ms per step

and registers the id in FIGURES (e2e/report/doc_figure_registry.py): the run folder under results/,
a function of that folder (e2e/report/doc_figure_values.py: its summary.json, cells.jsonl,
requests.jsonl, through the project's own loaders) returning the numbers, and the format that prints
them. `check` fails when a marked text is not what its figure
prints now (the precision is the format's), names an id that is not registered, or a registered id
quoted nowhere; `update` rewrites the marked text and dates the correction in place, as the seed's
report does: "(corrected 2026-12-06: was X)". A new marker written as `<!-- fig:ID -->?<!-- /fig -->`
is filled without a correction note.

    python -m e2e.report.doc_figures check     # exit 1 naming each stale figure
    python -m e2e.report.doc_figures update    # rewrite them (dated), then review the diff

tests/guarantees/test_doc_figures.py runs `check` in CI.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from e2e.errors import UserError
from e2e.report.doc_figure_registry import FIGURES, figure

ROOT = Path(__file__).resolve().parents[2]
# The pages that quote committed runs; every Markdown page under docs/ is read too.
PAGES = ("README.md", "results/README.md")
MARK = re.compile(r"<!-- fig:(?P<id>[A-Za-z0-9_./\-]+) -->(?P<text>.*?)<!-- /fig -->", re.S)
NEW = "?"
CORRECTED = "(corrected "  # a dated correction after a rewritten figure: (corrected DAY: was OLD)


def pages(root: Path = ROOT) -> list[Path]:
    return [p for p in (root / q for q in PAGES) if p.is_file()] + sorted((root / "docs").rglob("*.md"))


@dataclass(frozen=True)
class Quote:
    page: Path
    line: int
    id: str
    text: str


FENCE = re.compile(r"^ *(```|~~~).*?^ *\1", re.S | re.M)


def _marks(text: str) -> list[re.Match[str]]:
    """The markers outside fenced code blocks (an example of a marker is not a figure)."""
    fenced = [m.span() for m in FENCE.finditer(text)]
    return [m for m in MARK.finditer(text) if not any(a <= m.start() < b for a, b in fenced)]


def quotes(paths: Iterable[Path]) -> list[Quote]:
    out = []
    for p in paths:
        text = p.read_text()
        for m in _marks(text):
            out.append(Quote(p, text.count("\n", 0, m.start()) + 1, m["id"], m["text"]))
    return out


def _rendered(ids: Iterable[str], results: Path) -> dict[str, str | Exception]:
    out: dict[str, str | Exception] = {}
    for i in ids:
        if (f := figure(i)) is not None:
            try:
                out[i] = f.render(results)
            except (
                LookupError,
                OSError,
                ValueError,
                KeyError,
                TypeError,
                UserError,
            ) as e:  # UserError: a malformed folder
                out[i] = e
    return out


def check(root: Path = ROOT, results: Path | None = None, figures: Iterable[str] | None = None) -> list[str]:
    """One line per stale, unknown, unreadable or unquoted figure; empty when the pages hold."""
    qs = quotes(pages(root))
    now = _rendered({q.id for q in qs}, results or root / "results")
    problems = []
    for q in qs:
        where = f"{q.page.relative_to(root)}:{q.line}: fig:{q.id}"
        got = now.get(q.id)
        if (f := figure(q.id)) is None:
            problems.append(f"{where} is not registered in e2e/report/doc_figure_registry.py")
        elif isinstance(got, Exception):
            problems.append(f"{where}: cannot be recomputed from results/{f.run}: {got}")
        elif got != q.text:
            problems.append(f"{where} reads {q.text!r}; its run folder gives {got!r}")
    quoted = {q.id for q in qs}
    problems += [
        f"fig:{i} is registered and quoted nowhere"
        for i in sorted(set(FIGURES if figures is None else figures) - quoted)
    ]
    return problems


def correction(day: str, was: str) -> str:
    """The dated note `update` writes after a figure it rewrote."""
    return f"{CORRECTED}{day}: was {was})"


def without_corrections(text: str) -> str:
    """The text less its dated corrections, "(corrected 2026-12-06: was 1.2 (1.1 to 1.3))": a
    correction quotes the figure it replaced on purpose (scripts/results_index.py reads prose so)."""
    out, i = [], 0
    while (j := text.find(CORRECTED, i)) >= 0:
        out.append(text[i:j])
        depth, k = 0, j
        for k in range(j, len(text)):  # to the parenthesis that closes it
            depth += {"(": 1, ")": -1}.get(text[k], 0)
            if depth == 0:
                break
        i = k + 1
    return "".join(out) + text[i:]


def _fixed(text: str, now: dict[str, str | Exception], day: str, changed: list[str], page: str) -> str:
    keep = {m.start() for m in _marks(text)}

    def fix(m: re.Match[str]) -> str:
        got = now.get(m["id"])
        if m.start() not in keep or not isinstance(got, str) or got == m["text"]:
            return m[0]
        changed.append(f"{page}: fig:{m['id']} {m['text']!r} -> {got!r}")
        note = "" if m["text"] == NEW else " " + correction(day, m["text"])
        return f"<!-- fig:{m['id']} -->{got}<!-- /fig -->{note}"

    return MARK.sub(fix, text)


def update(root: Path = ROOT, results: Path | None = None, today: str | None = None) -> list[str]:
    """Rewrite every stale marked figure with its recomputed text, the correction dated after it."""
    day = today or dt.datetime.now(dt.UTC).date().isoformat()
    changed: list[str] = []
    for p in pages(root):
        text = p.read_text()
        now = _rendered({m["id"] for m in _marks(text)}, results or root / "results")
        new = _fixed(text, now, day, changed, str(p.relative_to(root)))
        if new != text:
            p.write_text(new)
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m e2e.report.doc_figures", description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["check", "update"])
    a = ap.parse_args(argv)
    lines = check() if a.command == "check" else update()
    for line in lines:
        print(line)
    if a.command == "check":
        print(f"doc figures: {len(lines)} problem(s)" if lines else "doc figures ok")
        return 1 if lines else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
