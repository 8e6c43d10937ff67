"""The run loop's side of kernel profiles (e2e/profile/): where a server's profiler writes, and, at the
end of the server's life (after its timed and bookend rounds, so no profiled round ever precedes a timed
one on a server), one profiled long and short round per cell it measured, each a profiles.jsonl row.

A cell that cannot be profiled gets a `missing` row and one line on the console; the run goes on, and
nothing measured is touched. Profiling off (profile.enabled = false, --no-profile, or the arm's
profile = false) writes no rows at all: the report reads the config for why."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from e2e.design.config import ArmCfg, Config
from e2e.design.plan import Cell
from e2e.profile import capture
from e2e.run.batch import BatchClient
from e2e.run.measure import CellClient, TokenSampler, check_row
from e2e.rundir.formats import profile_row
from e2e.rundir.store import PROFILES
from e2e.safety.interrupts import INTERRUPTS
from e2e.safety.safe_io import probe_writable
from e2e.serve import profiler_args as server_args
from e2e.serve.launch import server_spec
from e2e.serve.server import VllmServer


class _Rows(Protocol):
    @property
    def root(self) -> Any: ...

    def cell_dir(self, key: str) -> Path: ...

    def append(self, name: str, row: Any) -> None: ...


def wanted(cfg: Config, arm: ArmCfg) -> bool:
    return cfg.profile.enabled and arm.profile


def trace_dir(cfg: Config, arm: ArmCfg, store: _Rows, key: str, attempt: int) -> tuple[Path | None, str | None]:
    """Where this server's workers write their traces (cells/<key>/profile-a<n>/), or None and why
    not (None, None: profiling is off for this arm). A folder that cannot be written is one line, and
    the server starts without the profiler (vLLM would fail the stop, not the start)."""
    if not wanted(cfg, arm):
        return None, None
    if server_args.configured_by_user(server_spec(cfg, arm, None)):
        return (
            None,
            f"arm {arm.name} configures vLLM's profiler itself ({server_args.FLAG}): not profiled by the harness",
        )
    d = store.cell_dir(key) / f"profile-a{attempt}"
    try:
        d.mkdir(exist_ok=True)
        probe_writable(d)
    except OSError as exc:
        return None, f"profiler folder {d}: cannot be written ({exc.strerror or exc}); cells not profiled"
    return d, None


def _sender(
    cfg: Config, cell: Cell, client: CellClient, batch: Callable[[Cell], BatchClient], sampler: TokenSampler
) -> Callable[[int], str | None]:
    """One untimed round at the cell's point, as its timing sends it: one fresh prompt at c = 1 on the
    fresh route, else the cell's c prompts, primed first (outside the profiler), together."""
    depth = cell.depth
    if cfg.workload.route == "fresh":

        def one(n: int) -> str | None:
            return check_row(client.complete(sampler.prompt(depth), n), depth, n)

        return one
    b = batch(cell)
    prompts = [sampler.prompt(depth) for _ in range(b.c)]
    b.send(prompts, 1)  # primed, as the timed rounds' prompts were

    def together(n: int) -> str | None:
        return next((p for o in b.send(prompts, n) if (p := check_row(o, depth, n))), None)

    return together


def profile_server(
    cfg: Config,
    store: _Rows,
    server: VllmServer,
    cells: list[tuple[Cell, str]],
    client: CellClient,
    batch: Callable[[Cell], BatchClient],
    sampler: TokenSampler,
    folder: Path | None,
    why_not: str | None,
    note: Callable[[str], None],
    phase: Callable[[Cell], None] = lambda cell: None,
) -> None:
    """Each measured (cell, attempt) of this server profiled in turn; one profiles.jsonl row each."""
    if not cells or (folder is None and why_not is None):
        return
    wl, pc = cfg.workload, cfg.profile
    prof = (
        capture.ServerProfiler(server.base_url, server.api_key, folder, cfg.server.tensor_parallel_size)
        if folder
        else None
    )
    try:
        for cell, attempt in cells:
            phase(cell)
            if prof is None:
                fields: dict[str, Any] = {"status": "missing", "reason": why_not}
            else:
                try:
                    send = _sender(cfg, cell, client, batch, sampler)
                    dest = Path(folder or ".") / cell.cell_id
                    fields = capture.profile_cell(
                        prof, send, wl.long_tokens, wl.short_tokens, pc.trace, pc.trace_cap_mib, dest, Path(store.root)
                    )
                except INTERRUPTS:
                    raise
                except Exception as exc:  # a server that died here loses only its profiles
                    fields = {"status": "missing", "reason": f"{type(exc).__name__}: {str(exc)[:200]}"}
            if fields["status"] != "ok":
                note(f"{cell.cell_id}: no kernel profile: {fields['reason']}")
            ident = {**cell.identity(), "attempt": attempt}
            store.append(PROFILES, profile_row(**ident, **fields))
            client.resync()  # its /metrics baseline moved under the profiled rounds
    finally:
        if prof is not None:
            prof.close()
