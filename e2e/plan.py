"""Cells in counterbalanced order. Pure functions: no I/O, no server, no clock.

A pass walks the depths in ascending order and, at each depth, runs every arm in the pass's arm
order. Pass 1 uses the order named by `run.order`; each later pass reverses the previous one (ABBA),
so drift over a run cannot land on the same arm twice.

In `per-arm-pass` server mode one server serves all depths of an arm within a pass, so a pass runs
arm by arm instead (each arm walking its depths); cells that share a server share `server_key`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from e2e.config import Config, order_arms


@dataclass(frozen=True)
class Cell:
    index: int  # position in the run, from 0
    pass_: int  # from 1 (serialised as "pass")
    arm: str
    depth: int
    server_key: str  # cells with the same key share one server (one per cell in fresh mode)

    @property
    def cell_id(self) -> str:
        return f"p{self.pass_}-d{self.depth}-{self.arm}"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["pass"] = d.pop("pass_")
        return {"index": d["index"], "cell_id": self.cell_id, "pass": d["pass"], "arm": self.arm,
                "depth": self.depth, "server_key": self.server_key}


def pass_orders(first: list[str], passes: int) -> list[list[str]]:
    """Arm order for each pass: the first as given, then alternately reversed."""
    return [list(first) if p % 2 == 0 else list(reversed(first)) for p in range(passes)]


def make_plan(cfg: Config, passes: int | None = None) -> list[Cell]:
    names = [a.name for a in cfg.arms]
    first = order_arms(cfg.run.order, names)
    n_passes = passes if passes is not None else cfg.default_passes()
    depths = sorted(cfg.workload.depths)
    cells: list[Cell] = []
    for p, arms in enumerate(pass_orders(first, n_passes), start=1):
        if cfg.server.mode == "per-arm-pass":
            pairs = [(arm, d) for arm in arms for d in depths]
        else:
            pairs = [(arm, d) for d in depths for arm in arms]
        for arm, d in pairs:
            key = f"p{p}-{arm}" if cfg.server.mode == "per-arm-pass" else f"p{p}-d{d}-{arm}"
            cells.append(Cell(index=len(cells), pass_=p, arm=arm, depth=d, server_key=key))
    return cells


def next_pass(cfg: Config, cells: list[Cell]) -> list[Cell]:
    """The cells of one more pass after `cells` (adaptive replication), continuing the alternation
    of arm order: make_plan's plan for n + 1 passes begins with its plan for n."""
    n = max((c.pass_ for c in cells), default=0)
    more = make_plan(cfg, passes=n + 1)
    if [c.cell_id for c in more[:len(cells)]] != [c.cell_id for c in cells]:
        raise ValueError("the plan on disk is not this config's plan: cannot extend it")
    return more[len(cells):]


def plan_table_rows(cells: list[Cell]) -> list[tuple[str, ...]]:
    return [(str(c.index), str(c.pass_), c.arm, str(c.depth), c.cell_id) for c in cells]
