"""Where a run's server groups run: `local` (the run loop in this process, one server at a time; the
default) or `ray` (each group a Ray task on a cluster's node, side by side up to a cap per host).

Both write the same run folder: only this process (the driver) writes it, rows in the order they
arrive, so a run started by one executor can be resumed by the other. Ray is an optional extra
(`pip install 'vllm-e2e-bench[ray]'`); nothing here imports it unless `ray` is chosen.

An executor has: prepare(cfg, cells, manifest) before anything is written (bad input is one line
then), describe() for the manifest's `executors` list, run(cfg, store, cells, progress, sampler)
for the cells without a row, and close().
"""

from __future__ import annotations

import socket
from typing import Any

from e2e.errors import UserError
from e2e.run.executors.options import KINDS, ExecutorOptions  # noqa: F401 (the package's API)
from e2e.rundir.formats import now


class LocalExecutor:
    """Today's loop: e2e/run/runner.py in this process, every server on this host, one at a time."""

    kind = "local"

    def prepare(self, cfg: Any, cells: list[Any], manifest: dict[str, Any] | None = None) -> None:
        """On --resume of a run that Ray nodes worked on: this host's vLLM must be each arm's."""
        if manifest and any(e.get("kind") == "ray" for e in manifest.get("executors") or []):
            from e2e.run.executors.versions import arm_versions, check_one_version, earlier
            from e2e.rundir import manifest as mf
            from e2e.serve.launch import server_python

            pythons = {server_python(cfg, a) for a in cfg.arms}
            here = arm_versions(cfg, {p: mf.installation(p) for p in pythons}, "this host")  # 1 probe each
            check_one_version(cfg, earlier(manifest) + [("this host", here)])

    def describe(self) -> dict[str, Any]:
        return {"kind": "local", "started": now(), "host": socket.gethostname(), "max_at_once": 1}

    def run(self, cfg: Any, store: Any, cells: list[Any], progress: Any, sampler: Any) -> list[dict[str, Any]]:
        from e2e.run.runner import Runner
        from e2e.stats.cells import target_ci_stop_rule

        return Runner(cfg, store, cells, progress, sampler, stop_rule_factory=target_ci_stop_rule).run()

    def observed(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


def create(opts: ExecutorOptions) -> Any:
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
