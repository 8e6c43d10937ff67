"""Slots from a cluster's nodes: where one server group runs (pure; the node list is ray.nodes()'s).

A slot is a node and, on GPU nodes, a set of tensor_parallel_size GPUs on it. The cap on cells at
once per host (`--max-per-host`, default 1) also caps the slots a host gets: with one cell at a time,
more slots on that host would only make the arms harder to balance, never the run faster. Slots are
ordered host-first (every host's first slot, then every host's second, ...) so `--max-slots N`
keeps them spread over the hosts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from e2e.errors import UserError


@dataclass(frozen=True)
class Slot:
    name: str  # "n0.g2-3" (GPUs 2 and 3 of node 0), "n0" (a CPU node), "n0.c1"
    node_id: str
    host: str  # the node's address; the per-host cap counts by it
    gpus: tuple[int, ...]  # the node's GPU ids this slot's server sees (empty on CPU)
    cpus: float  # the CPU share asked of Ray for a cell here

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "gpus": list(self.gpus)}


def make_slots(
    nodes: list[dict[str, Any]],
    tp: int,
    max_per_host: int = 1,
    max_slots: int | None = None,
    cpus_per_cell: float | None = None,
) -> list[Slot]:
    """Every usable slot of the alive nodes. GPUs are used when any node has one: each cell then asks
    for `tp` GPUs and nodes with fewer are left out; on a CPU-only cluster a cell asks for none."""
    if max_per_host < 1:
        raise UserError(f"--max-per-host {max_per_host}: give 1 or more")
    if max_slots is not None and max_slots < 1:
        raise UserError(f"--max-slots {max_slots}: give 1 or more")
    alive = sorted(
        (n for n in nodes if n.get("Alive", n.get("alive"))),
        key=lambda n: (n.get("NodeManagerAddress", ""), n["NodeID"]),
    )
    use_gpus = any((n.get("Resources") or {}).get("GPU", 0) >= 1 for n in alive)
    # host -> its nodes' slots, the nodes taking turns (a host's first slots spread over its nodes)
    turns: dict[str, list[tuple[int, int, dict[str, Any], tuple[int, ...]]]] = {}
    for rank, n in enumerate(alive):
        res = n.get("Resources") or {}
        if use_gpus:
            sets = [tuple(range(k * tp, (k + 1) * tp)) for k in range(int(res.get("GPU", 0)) // tp)]
        else:  # a node without a CPU (a driver-only head) takes no cell
            sets = [()] * max_per_host if res.get("CPU", 0) >= 1 else []
        host = n.get("NodeManagerAddress") or n["NodeID"]
        turns.setdefault(host, []).extend((k, rank, n, g) for k, g in enumerate(sets))
    per_host = {h: [(r, n, g) for _, r, n, g in sorted(v, key=lambda x: (x[0], x[1]))] for h, v in turns.items()}
    rows = {h: s[:max_per_host] for h, s in per_host.items()}
    if not any(rows.values()):
        need = f"{tp} GPU(s) per cell (tensor parallel {tp})" if use_gpus else "a node"
        raise UserError(f"the Ray cluster has no node that can take a cell: need {need}")
    ordered = []
    for i in range(max(len(v) for v in rows.values())):
        ordered += [v[i] for v in rows.values() if i < len(v)]
    ordered = ordered[:max_slots]
    on_node: dict[int, int] = {}
    for rank, _, _ in ordered:
        on_node[rank] = on_node.get(rank, 0) + 1
    slots: list[Slot] = []
    for rank, n, gpus in ordered:
        cpu = float((n.get("Resources") or {}).get("CPU", 0))
        share = cpus_per_cell if cpus_per_cell is not None else cpu / on_node[rank]
        share = float(int(share)) if share >= 1 else share  # Ray takes fractions below 1 only
        k = sum(1 for s in slots if s.node_id == n["NodeID"])
        name = (
            f"n{rank}.g{gpus[0]}" + (f"-{gpus[-1]}" if len(gpus) > 1 else "")
            if gpus
            else f"n{rank}"
            if on_node[rank] == 1
            else f"n{rank}.c{k}"
        )
        slots.append(Slot(name, n["NodeID"], n.get("NodeManagerAddress") or n["NodeID"], gpus, share))
    return slots


def least_loaded(slots: list[Slot], skip: set[str], load: dict[str, int]) -> Slot | None:
    """The slot with the fewest groups waiting, among those not skipped (a slot whose GPU another
    process holds, a dead node's); None when every slot is skipped."""
    usable = [s for s in slots if s.name not in skip]
    return min(usable, key=lambda s: load.get(s.name, 0)) if usable else None
