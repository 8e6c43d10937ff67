"""What the command line says about where the cells run (e2e/run/executors/__init__.py creates the
executor from it; the Ray executor reads it too, without importing the package's face)."""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("local", "ray")


@dataclass(frozen=True)
class ExecutorOptions:
    kind: str = "local"
    ray_address: str | None = None  # None: a local Ray cluster started for the run
    max_per_host: int = 1  # cells at once per host (side by side they share CPUs, PCIe, memory)
    max_slots: int | None = None  # use at most this many slots
    balance: str = "warn"  # "strict": refuse a slot assignment that cannot balance the arms
    cpus_per_cell: float | None = None  # the CPU share a Ray cell asks for (default: its node's share)
