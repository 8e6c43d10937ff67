"""Cells in counterbalanced order. Pure functions: no I/O, no server, no clock.

A pass walks the design points (e2e/design/point.py: every depth at every concurrency, by c then
depth) and, at each point, runs every arm in the pass's arm order. Pass 1 uses the order named by `run.order`; each later pass reverses the previous one (ABBA),
so drift over a run cannot land on the same arm twice.

In `per-arm-pass` server mode one server serves all points of an arm within a pass, so a pass runs
arm by arm instead (each arm walking its points); cells that share a server share `server_key`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from e2e.design.point import Point
from e2e.design.schema import Config, order_arms


@dataclass(frozen=True)
class Cell:
    index: int  # position in the run, from 0
    pass_: int  # from 1 (serialised as "pass")
    arm: str
    depth: int
    server_key: str  # cells with the same key share one server (one per cell in fresh mode)
    rounds: int | None = None  # timed rounds when not workload.rounds (adaptive replication's allocation)
    concurrency: int = 1  # requests decoding together in a round (workload.concurrency)

    @property
    def point(self) -> Point:
        """Where the cell measures; ids name it `d<depth>`, `-c<c>` above batch 1 (so the ids of
        batch-1 runs are what they always were)."""
        return Point(self.depth, self.concurrency)

    @property
    def cell_id(self) -> str:
        return f"p{self.pass_}-{self.point.name}-{self.arm}"

    def identity(self) -> dict[str, Any]:
        """What every row of this cell names it by (cells.jsonl and requests.jsonl): its id, pass, arm
        and design point (`concurrency` only above batch 1, as the ids)."""
        out: dict[str, Any] = {"cell_id": self.cell_id, "pass": self.pass_, "arm": self.arm, "depth": self.depth}
        return out if self.concurrency == 1 else {**out, "concurrency": self.concurrency}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["pass"] = d.pop("pass_")
        out = {
            "index": d["index"],
            "cell_id": self.cell_id,
            "pass": d["pass"],
            "arm": self.arm,
            "depth": self.depth,
            "server_key": self.server_key,
        }
        if self.concurrency != 1:
            out["concurrency"] = self.concurrency
        return out if self.rounds is None else {**out, "rounds": self.rounds}

    @classmethod
    def from_dict(cls, c: dict[str, Any]) -> Cell:
        """A plan.json entry (formats.PlanEntry checked it)."""
        return cls(
            index=c["index"],
            pass_=c["pass"],
            arm=c["arm"],
            depth=c["depth"],
            server_key=c["server_key"],
            rounds=c.get("rounds"),
            concurrency=c.get("concurrency", 1),
        )


def pass_orders(first: list[str], passes: int) -> list[list[str]]:
    """Arm order for each pass: the first as given, then alternately reversed."""
    return [list(first) if p % 2 == 0 else list(reversed(first)) for p in range(passes)]


def make_plan(cfg: Config, passes: int | None = None) -> list[Cell]:
    names = [a.name for a in cfg.arms]
    first = order_arms(cfg.run.order, names)
    n_passes = passes if passes is not None else cfg.default_passes()
    points = cfg.workload.points
    cells: list[Cell] = []
    for p, arms in enumerate(pass_orders(first, n_passes), start=1):
        if cfg.server.mode == "per-arm-pass":
            pairs = [(arm, pt) for arm in arms for pt in points]
        else:
            pairs = [(arm, pt) for pt in points for arm in arms]
        for arm, pt in pairs:
            key = f"p{p}-{arm}" if cfg.server.mode == "per-arm-pass" else f"p{p}-{pt.name}-{arm}"
            cells.append(
                Cell(index=len(cells), pass_=p, arm=arm, depth=pt.depth, server_key=key, concurrency=pt.concurrency)
            )
    return cells


def next_pass(cfg: Config, cells: list[Cell], rounds: dict[Point, int] | None = None) -> list[Cell]:
    """The cells of one more pass after `cells` (adaptive replication), continuing the alternation
    of arm order: make_plan's plan for n + 1 passes begins with its plan for n. `rounds`: timed
    rounds per point for the new cells (None: workload.rounds)."""
    n = max((c.pass_ for c in cells), default=0)
    more = make_plan(cfg, passes=n + 1)
    if [c.cell_id for c in more[: len(cells)]] != [c.cell_id for c in cells]:
        raise ValueError("the plan on disk is not this config's plan: cannot extend it")
    new = more[len(cells) :]
    if rounds:
        new = [replace(c, rounds=rounds.get(c.point)) for c in new]
    return new


def plan_table_rows(cells: list[Cell]) -> list[tuple[str, ...]]:
    return [(str(c.index), str(c.pass_), c.arm, str(c.point), c.cell_id) for c in cells]


# -- slots: where server groups run (an executor with several GPUs or nodes) ------------------------
# A slot is a blocking factor (GPUs and nodes differ), so every arm is spread evenly over the slots
# and the passes, Latin-square fashion: a group's slot is (arm index + arms x depth index + pass - 1)
# mod S. Each arm at each depth moves one slot per pass, so over a multiple of S passes it visits
# every slot equally often; within a pass, arms (and depths) sit on different slots while there are
# enough of them. The formula depends only on the group, so adding passes (adaptive replication) or
# resuming keeps every earlier assignment.
def server_groups(cells: list[Cell]) -> list[list[Cell]]:
    """Consecutive cells sharing a server_key (one cell in fresh mode, an arm-pass otherwise)."""
    out: list[list[Cell]] = []
    for c in cells:
        if out and out[-1][0].server_key == c.server_key:
            out[-1].append(c)
        else:
            out.append([c])
    return out


def _group_position(group: list[Cell], arms: list[str], points: list[Point]) -> int:
    k = arms.index(group[0].arm) if group[0].arm in arms else len(arms)
    # A group with several points (per-arm-pass) is one unit: its slot does not depend on the point.
    j = points.index(group[0].point) if len(group) == 1 and group[0].point in points else 0
    return k + len(arms) * j + group[0].pass_ - 1


def assign_slots(cells: list[Cell], n_slots: int, arms: list[str]) -> dict[str, int]:
    """server_key -> slot index in range(n_slots), for every group of `cells`."""
    if n_slots < 1:
        raise ValueError("no slot to run on")
    points = sorted({c.point for c in cells})
    return {g[0].server_key: _group_position(g, arms, points) % n_slots for g in server_groups(cells)}


def slot_balance(cells: list[Cell], assignment: dict[str, int], slot_names: list[str]) -> dict[str, Any]:
    """Whether every arm (at every depth, when a server serves one depth) has the same number of
    servers on every slot. Returns {balanced, counts: {"arm@depth": {slot: n}}, problem, suggest}."""
    groups = server_groups(cells)
    per_depth = all(len(g) == 1 for g in groups)
    counts: dict[str, dict[str, int]] = {}
    for g in groups:
        unit = f"{g[0].arm}@{g[0].point}" if per_depth else g[0].arm
        row = counts.setdefault(unit, {s: 0 for s in slot_names})
        row[slot_names[assignment[g[0].server_key]]] += 1
    uneven = {u: c for u, c in counts.items() if len(set(c.values())) > 1}
    passes = len({c.pass_ for c in cells})
    problem = suggest = None
    if uneven:
        unit, c = next(iter(uneven.items()))
        spread = "/".join(str(v) for v in c.values())
        problem = (
            f"cannot balance the arms over {len(slot_names)} slots: {passes} pass(es) is not a multiple "
            f"of {len(slot_names)}, so {unit} runs {spread} times on {'/'.join(c)}"
        )
        fits = [n for n in range(len(slot_names), 0, -1) if passes % n == 0]
        more = -(-passes // len(slot_names)) * len(slot_names)
        suggest = f"use --passes {more} (a multiple of {len(slot_names)}) or --max-slots {fits[0]}"
    return {
        "balanced": not uneven,
        "n_slots": len(slot_names),
        "passes": passes,
        "counts": counts,
        "problem": problem,
        "suggest": suggest,
    }
