"""A design point: where a cell measures, (depth, concurrency). The one key from plan to report.

A run measures per-step decode at each depth (tokens of context) and each concurrency c (requests
decoding together). Every estimate, fit group, comparison and table row belongs to one point.
Batch-1 points read and print as the bare depth did before concurrency existed (`1024`, a row's
`{"depth": 1024}`), so run folders written then re-render byte-identical. Points order by
concurrency first, then depth: a report's table per c falls out of the order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import total_ordering
from typing import Any


@total_ordering
@dataclass(frozen=True)
class Point:
    depth: int
    concurrency: int = 1

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Point):
            return NotImplemented
        return (self.concurrency, self.depth) < (other.concurrency, other.depth)

    def __str__(self) -> str:
        """As messages and tables name it: `8192`, or `8192 (c=4)` above batch 1."""
        return str(self.depth) if self.concurrency == 1 else f"{self.depth} (c={self.concurrency})"

    @property
    def name(self) -> str:
        """As ids name it: `d8192`, `d8192-c4` (cell ids, figure files)."""
        return f"d{self.depth}" if self.concurrency == 1 else f"d{self.depth}-c{self.concurrency}"

    def fields(self) -> dict[str, int]:
        """The row fields that carry it: `depth`, and `concurrency` only above batch 1."""
        return (
            {"depth": self.depth} if self.concurrency == 1 else {"depth": self.depth, "concurrency": self.concurrency}
        )

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> Point:
        """The point of a row (plan entry, cell row, table row) that carries `depth` and maybe
        `concurrency` (absent: 1, as in every row written before concurrency existed)."""
        return cls(int(row["depth"]), int(row.get("concurrency") or 1))


def grid(points: list[Point]) -> tuple[list[int], list[int]]:
    """The depths and the concurrencies a set of points spans, each ascending."""
    return sorted({p.depth for p in points}), sorted({p.concurrency for p in points})
