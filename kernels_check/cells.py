"""What a sweep measures: shapes, contexts, dtypes, and the cells they make. Pure, no torch."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, TypedDict

from e2e.errors import UserError

HEAD_SIZE = 128
BLOCK_SIZE = 16
# q/kv head ratios 1..4 at 8 kv heads, and gemma-3-27b's 32 q / 16 kv heads (ratio 2): the shape that
# meets every condition of the gfx11 gate except the ratio.
DEFAULT_SHAPES = "8/8,16/8,24/8,32/8,32/16"
DEFAULT_CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768)
QUICK_SHAPES = "16/8,32/16"
QUICK_CONTEXTS = (1024, 8192)
DTYPES = ("bf16", "fp16")


@dataclass(frozen=True)
class Shape:
    q_heads: int
    kv_heads: int
    head_size: int = HEAD_SIZE
    block_size: int = BLOCK_SIZE

    @property
    def ratio(self) -> int:
        return self.q_heads // self.kv_heads

    @property
    def name(self) -> str:
        return f"{self.q_heads}/{self.kv_heads}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio, "name": self.name}


def parse_shapes(text: str, head_size: int = HEAD_SIZE, block_size: int = BLOCK_SIZE) -> list[Shape]:
    """'8/8,32/16' -> shapes. q heads must be a positive multiple of kv heads."""
    out = []
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        try:
            q, kv = (int(x) for x in part.split("/"))
        except ValueError:
            raise UserError(f"--shapes: {part!r} is not Q/KV (e.g. 32/16)") from None
        if q <= 0 or kv <= 0 or q % kv:
            raise UserError(f"--shapes: {part!r}: q heads must be a positive multiple of kv heads")
        out.append(Shape(q, kv, head_size, block_size))
    if not out:
        raise UserError("--shapes: no shapes given")
    return out


def parse_ints(text: str, what: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{what}: expected comma-separated integers, got {text!r}") from None
    if not vals or any(v <= 0 for v in vals):
        raise UserError(f"{what}: expected positive integers, got {text!r}")
    return vals


def parse_dtypes(text: str, what: str = "--dtypes") -> list[str]:
    vals = [x.strip() for x in text.split(",") if x.strip()]
    bad = [v for v in vals if v not in DTYPES]
    if bad or not vals:
        raise UserError(f"{what}: {', '.join(bad) or 'nothing'} not in {', '.join(DTYPES)}")
    return vals


@dataclass(frozen=True)
class Cell:
    """One sweep cell: fresh random inputs, every path run on them."""

    index: int
    dtype: str
    shape: Shape
    context: int
    seed: int

    @property
    def cell_id(self) -> str:
        return f"{self.dtype}-q{self.shape.q_heads}kv{self.shape.kv_heads}-c{self.context}"


def sweep_cells(shapes: list[Shape], contexts: list[int], dtypes: list[str], seed: int) -> list[Cell]:
    """dtype-major, then shape, then context; each cell gets its own seed (seed + index)."""
    cells: list[Cell] = []
    for d in dtypes:
        for s in shapes:
            for c in contexts:
                cells.append(Cell(len(cells), d, s, c, seed + len(cells)))
    return cells


class Plan(TypedDict):
    """A sweep's validated parameters (kernels_check/cli.py's resolve)."""

    shapes: list[Shape]
    contexts: list[int]
    dtypes: list[str]
    fault_dtypes: list[str]
    fault_shapes: list[Shape]
    fault_lengths: list[int]
    reps: int
