"""Where a run's server groups run: `local` (the run loop in this process, one server at a time; the
default) or `ray` (each group a Ray task on a cluster's node, side by side up to a cap per host).

Both write the same run folder: only this process (the driver) writes it, rows in the order they
arrive, so a run started by one executor can be resumed by the other. Ray is an optional extra
(`pip install 'vllm-e2e-bench[ray]'`); nothing here imports it unless `ray` is chosen.

Every executor is an `Executor` (the protocol below); the type checker holds both to it.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any, Protocol

from e2e.errors import UserError
from e2e.run.executors.options import KINDS, ExecutorOptions

if TYPE_CHECKING:
    from e2e.design.config import Config
    from e2e.design.plan import Cell
    from e2e.report.progress import Progress
    from e2e.run.measure import TokenSampler
    from e2e.rundir.formats import CellRowDict
    from e2e.rundir.store import RunStore

__all__ = ["KINDS", "Executor", "ExecutorOptions", "LocalExecutor", "create"]


class Executor(Protocol):
    """What the session (e2e/run/session.py) asks of an executor, in this order."""

    def prepare(self, cfg: Config, cells: list[Cell], manifest: dict[str, Any] | None = None) -> None:
        """Before anything is written: connect, check the hosts (bad input is one line here).
        `manifest` is the run's own on --resume: its earlier executors' versions must still hold."""

    def describe(self) -> dict[str, Any]:
        """This executor's entry for the manifest's `executors` list (one per start or resume)."""
        ...

    def run(
        self, cfg: Config, store: RunStore, cells: list[Cell], progress: Progress, sampler: TokenSampler
    ) -> list[CellRowDict]:
        """Measure the cells that have no row in `store` yet; returns the cell rows this call wrote.
        Called once per stage of a run (adaptive replication calls it again with more cells)."""
        ...

    def observed(self) -> dict[str, Any]:
        """What it saw while running (cells at once, the slots' final balance), merged into its
        manifest entry at the end; {} when it has nothing to add."""
        ...

    def close(self) -> None:
        """Release what prepare() took (a cluster, a connection); safe to call once more."""


class LocalExecutor:
    """Today's loop: e2e/run/runner.py in this process, every server on this host, one at a time."""

    kind = "local"

    def prepare(self, cfg: Config, cells: list[Cell], manifest: dict[str, Any] | None = None) -> None:
        """On --resume of a run that Ray nodes worked on: this host's vLLM must be each arm's."""
        if manifest and any(e.get("kind") == "ray" for e in manifest.get("executors") or []):
            from e2e.run.executors.versions import arm_versions, check_one_version, earlier
            from e2e.rundir import manifest as mf
            from e2e.serve.launch import server_python

            pythons = {server_python(cfg, a) for a in cfg.arms}
            here = arm_versions(cfg, {p: mf.installation(p) for p in pythons}, "this host")  # 1 probe each
            check_one_version(cfg, earlier(manifest) + [("this host", here)])

    def describe(self) -> dict[str, Any]:
        from e2e.rundir.formats import now  # lazy: the CLI imports this package to build its parser

        return {"kind": "local", "started": now(), "host": socket.gethostname(), "max_at_once": 1}

    def run(
        self, cfg: Config, store: RunStore, cells: list[Cell], progress: Progress, sampler: TokenSampler
    ) -> list[CellRowDict]:
        from e2e.run.runner import Runner
        from e2e.stats.cells import target_ci_stop_rule

        return Runner(cfg, store, cells, progress, sampler, stop_rule_factory=target_ci_stop_rule).run()

    def observed(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


if TYPE_CHECKING:  # both executors held to the protocol (mypy fails if either drifts); ray stays unimported
    from e2e.run.executors.ray_executor import RayExecutor

    _EXECUTORS: tuple[type[Executor], ...] = (LocalExecutor, RayExecutor)


def create(opts: ExecutorOptions) -> Executor:
    """The executor the options name. `ray` without the ray package is one line, not a traceback."""
    if opts.kind == "local":
        if (
            opts.ray_address
            or opts.max_slots is not None
            or opts.max_per_host != 1
            or opts.balance != "warn"
            or opts.cpus_per_cell is not None
        ):
            raise UserError(
                "--ray-address, --max-per-host, --max-slots, --slot-balance and --cpus-per-cell "
                "apply to --executor ray only"
            )
        return LocalExecutor()
    if opts.kind != "ray":
        raise UserError(f"--executor {opts.kind!r}: use one of {', '.join(KINDS)}")
    from e2e import extras

    extras.require("ray", "--executor ray")
    from e2e.run.executors.ray_executor import RayExecutor

    return RayExecutor(opts)
