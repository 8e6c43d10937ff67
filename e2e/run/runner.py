"""The run loop: plan -> (server, measurement) per cell -> rows on disk.

Every finished cell, ok or failed, gets exactly one row in cells.jsonl naming its final attempt;
request rows are appended as measured. An interrupted run can be resumed: cells with a row are never
repeated, the rest run from scratch on a fresh server.

Around every server its GPUs are checked (e2e/gpu/gpu_state.py: the samples, and the --gpu-exclusive
policy), and at the end of its life its first depth is measured again (e2e/stats/bookends.py); the last
cell's row carries that bookend.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from e2e import exits
from e2e.design.config import ArmCfg, Config, WorkloadCfg
from e2e.design.plan import Cell, server_groups
from e2e.design.point import Point
from e2e.errors import UserError
from e2e.gpu import gpu_state
from e2e.run.batch import BatchClient, measure_batch_cell
from e2e.run.measure import CellClient, CellResult, TokenSampler, measure_cell
from e2e.run.profiling import profile_server, trace_dir
from e2e.rundir import patch_evidence, routing
from e2e.rundir.formats import CellRowDict, cell_row, now, request_row
from e2e.rundir.gpu_rows import describe
from e2e.rundir.store import CELLS, REQUESTS
from e2e.safety.interrupts import sigterm_as_interrupt
from e2e.safety.redact import scrub
from e2e.serve import startup_phases
from e2e.serve.attempts import GaveUp, on_fresh_servers
from e2e.serve.launch import RunRoot, start_server
from e2e.serve.server import ServerGone, VllmServer, port_in_use
from e2e.stats import bookends
from e2e.stats.estimate import cell_estimate


class InertArm(UserError):
    """--fail-fast on an inert arm: the run stops after the cell that showed it (exit 3)."""

    exit_code = exits.CANNOT_DECIDE


class Rows(Protocol):
    """Where the loop's rows and files go: the run folder (e2e/rundir/store.py RunStore), or on a Ray
    node the driver's inbox and a scratch folder (e2e/run/executors/node_side.py NodeStore)."""

    @property
    def root(self) -> RunRoot: ...

    def finished_cell_ids(self) -> set[str]: ...

    def attempts_used(self, key: str) -> int: ...

    def cell_dir(self, key: str) -> Path: ...

    def log_path(self, name: str) -> Path: ...

    def append(self, name: str, row: Mapping[str, Any]) -> None: ...

    def void_rows(self, cell_id: str, attempt: str, why: str) -> None: ...


class Events(Protocol):
    """Where the loop reports: the console (e2e/report/progress.py Progress), or on a Ray node the
    driver's console through its inbox (node_side.py NodeProgress)."""

    def start(self, total: int, done: int) -> None: ...

    def phase(self, cell: Any, phase: str) -> None: ...

    def note(self, text: str) -> None: ...

    def cell_done(self, cell: Any, row: Mapping[str, Any]) -> None: ...

    def stop(self) -> None: ...


class Runner:
    def __init__(
        self,
        cfg: Config,
        store: Rows,
        cells: list[Cell],
        progress: Events,
        sampler: TokenSampler,
        stop_rule_factory: Callable[[Config], Any] | None = None,
        gpu_wait_s: float | None = None,
    ):
        self.cfg = cfg
        self.store = store
        self.cells = cells
        self.progress = progress
        self.stop_rule = stop_rule_factory(cfg) if stop_rule_factory else None
        self.sampler = sampler
        # retry: how long a GPU held before a start may take to clear (Ray: 0, another slot takes it)
        self.gpu_wait_s = gpu_state.PRESTART_WAIT_S if gpu_wait_s is None else gpu_wait_s
        self.inert_said: set[tuple[str, Point]] = set()  # (arm, point) already said inert on the console
        self._gpu_said = False  # gpu_state.preflight: once a run

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> list[CellRowDict]:
        """Run every cell that has no row yet; returns the rows written by this call."""
        done = self.store.finished_cell_ids()
        todo = [c for c in self.cells if c.cell_id not in done]
        self.progress.start(total=len(self.cells), done=len(self.cells) - len(todo))
        written: list[CellRowDict] = []
        try:
            with sigterm_as_interrupt():
                for group in server_groups(todo):
                    written += self._run_group(group)
        finally:
            self.progress.stop()
        return written

    def _run_group(self, group: list[Cell]) -> list[CellRowDict]:
        """Cells that share one server (one cell in fresh mode), each retried on fresh servers.

        Every cell has its own `retries`: on a shared server a failure is charged to the cell in
        hand, the cells already measured keep their rows, and the rest go on on a new server. A
        cell that gives up is recorded as failed and the group moves on to its next cell."""
        arm = self.cfg.arm(group[0].arm)
        key = group[0].server_key
        remaining = list(group)
        rows: list[CellRowDict] = []
        watch = self._watch(key, arm)
        # A resumed group numbers its servers past the attempts already on disk (their files stay theirs).
        ctx: dict[str, Any] = {"started": self.store.attempts_used(key), "watch": watch}

        def new_server(_: int) -> VllmServer:
            n = ctx["started"]  # this server key's n-th server: names its log and records uniquely
            tag = f"{n}-{secrets.token_hex(3)}"
            # Before anything starts: a GPU held by another process is reported (and may stop here).
            watch.before_start(key, tag, self.store.cell_dir(key) / f"gpu-a{n}" / "samples.jsonl")
            ctx["started"] += 1
            ctx.update(
                tag=tag, log=self.store.log_path(f"{key}.a{n}"), record_dir=self.store.cell_dir(key) / f"records-a{n}"
            )
            # vLLM's profiler configured for this server's profiled rounds (e2e/run/profiling.py)
            ctx["profile"] = trace_dir(self.cfg, arm, self.store, key, n)
            server = start_server(
                self.cfg, arm, self.store.root, key, ctx["record_dir"], ctx["log"], profile_dir=ctx["profile"][0]
            )
            self.progress.phase(remaining[0], "starting server")
            ctx["server"] = server
            return server  # its log is scrubbed of its secrets when it stops (server.py)

        def work(server: VllmServer, attempt: int) -> None:
            self._cells_on(server, arm, remaining, rows, ctx)

        def on_retry(attempt: int, exc: Exception) -> None:
            self._void(remaining, ctx, exc)
            self.progress.note(f"{remaining[0].cell_id}: {exc}; retrying on a fresh server")

        try:
            while remaining:
                try:
                    _, server, left = on_fresh_servers(
                        new_server,
                        work,
                        self.cfg.run.retries,
                        on_retry,
                        unit=lambda: remaining[0].cell_id if remaining else None,
                    )
                except GaveUp as g:
                    self._void(remaining, ctx, g.last)
                    rows.append(self._gave_up(remaining.pop(0), arm, ctx, g))
                    continue
                if left or port_in_use(server.port):
                    self.progress.note(f"warning: after teardown pids {left} / port {server.port} still in use")
        finally:
            watch.close()
        return rows

    def _void(self, remaining: list[Cell], ctx: dict[str, Any], exc: Exception) -> None:
        """The cell in hand lost its server: its rows of that attempt are marked voided (the cells the
        server finished before keep theirs, counted)."""
        if remaining and ctx.get("tag"):
            self.store.void_rows(remaining[0].cell_id, ctx["tag"], str(exc))

    def _watch(self, key: str, arm: ArmCfg) -> gpu_state.ServerWatch:
        """The GPU watch over a group's servers, with the attempts an earlier run of it voided."""
        env = {**os.environ, **self.cfg.server.env, **arm.env}
        probe = gpu_state.GpuProbe.open(env, self.cfg.server.tensor_parallel_size)
        if not self._gpu_said:  # the run's first group: a GPU that cannot be read is said before it starts
            self._gpu_said = True
            gpu_state.preflight(probe, self.cfg.run.gpu_exclusive, self.progress.note)
        watch = gpu_state.ServerWatch(probe, self.cfg.run.gpu_exclusive, self.progress.note, self.gpu_wait_s)
        watch.read_voided(self.store.cell_dir(key))
        return watch

    def _cells_on(
        self, server: VllmServer, arm: ArmCfg, remaining: list[Cell], rows: list[CellRowDict], ctx: dict[str, Any]
    ) -> None:
        """The group's cells, in order, on one started server; each measured cell leaves `remaining`."""
        watch = ctx["watch"]
        assert server.proc is not None  # a started server
        startup_s = server.startup_s or 0.0
        client = CellClient(server.base_url, server.api_key, self.cfg.server.request_timeout_s)
        watch.started(server.proc.pid, server.server_id)
        ctx["opening"] = None  # this server's first cell: what its bookend measures again
        measured: list[tuple[Cell, str]] = []  # profiled once the server's timed and bookend rounds are done
        try:
            while remaining:
                watch.begin_cell(remaining[0].cell_id)
                if startup_s:
                    watch.checkpoint("ready")
                row = self._measure(remaining[0], arm, server, client, ctx, startup_s)
                if len(remaining) == 1:  # the server's last cell: its bookend goes in this row
                    row["bookend"] = self._bookend(server, client, ctx)
                self._write(remaining[0], row)
                rows.append(row)
                if row["status"] == "ok":
                    measured.append((remaining[0], ctx["tag"]))
                remaining.pop(0)
                startup_s = 0.0  # later cells on a shared server paid no start
            profile_server(
                self.cfg,
                self.store,
                server,
                measured,
                client,
                lambda c: self._batch(c, server, ctx),
                self.sampler,
                ctx["profile"][0],
                ctx["profile"][1],
                self.progress.note,
                lambda c: self.progress.phase(c, "profiling"),
            )
        finally:
            client.close()
            for batch in ctx.pop("batch", {}).values():
                batch.close()

    def _gave_up(self, cell: Cell, arm: ArmCfg, ctx: dict[str, Any], g: GaveUp) -> CellRowDict:
        """A cell whose every server failed: its failed row (the plugin's own words on why, when it
        left any), and with --fail-fast the end of the run."""
        folded = routing.fold_records(ctx["record_dir"], arm, wait_s=0)  # keeps a worker's plugin error
        problem = routing.patch_problem(folded, arm)  # why the start failed, in the plugin's words
        error = str(g) + (f"; {problem}" if problem else "")
        tail = scrub(g.log_tail, ctx["server"].secrets)  # rows never carry a secret value
        row = self._record_failed(cell, ctx, error, tail, g.leftover_pids, folded)
        if self.cfg.run.fail_fast:
            raise UserError(f"cell {cell.cell_id} failed (--fail-fast): {g.last}") from None
        return row

    def _measure(
        self, cell: Cell, arm: ArmCfg, server: VllmServer, client: CellClient, ctx: dict[str, Any], startup_s: float
    ) -> CellRowDict:
        base = {**cell.identity(), "attempt": ctx["tag"]}
        # the allocation of adaptive replication may give a cell its own number of rounds
        wl = self.cfg.workload if cell.rounds is None else self.cfg.workload.model_copy(update={"rounds": cell.rounds})
        watch = ctx["watch"]
        if self.cfg.workload.route == "primed":
            skip = self._batch(cell, server, ctx).capacity_problem(cell.depth, wl.long_tokens)
            if skip:
                self.progress.note(f"{cell.cell_id}: {skip}")
                return cell_row(
                    **base, index=cell.index, server_key=cell.server_key, status="skipped", error=skip, finished=now()
                )
        res = self._rounds(
            cell,
            client,
            ctx,
            wl,
            emit=lambda row: self.store.append(REQUESTS, request_row(**base, **row)),
            phase=lambda p: self.progress.phase(cell, p),
            stop_rule=self.stop_rule,
            between_rounds=lambda k: watch.checkpoint(f"round {k - 1}" if k else "warm"),
        )
        if not server.alive():
            raise ServerGone("server exited during the cell")
        if ctx["opening"] is None:
            ctx["opening"] = {"cell": cell, "rows": res.rows}
        if w := watch.throttle_warning():
            self.progress.note(w)
        est = cell_estimate(res.rows, wl.long_tokens, wl.short_tokens)
        seen = ctx.get("patched_seen") or {}
        folded = routing.fold_records(ctx["record_dir"], arm, before=seen.get(ctx["tag"]))
        if folded.get("patched"):  # this server's total so far: its next cell counts from here
            ctx["patched_seen"] = {ctx["tag"]: folded["patched"]["since_server_start"]}
        problem = routing.patch_problem(folded, arm)
        status = "ok" if est["decode_ms_per_token"] is not None and problem is None else "failed"
        # Where the start went, from the server's own log; only the cell that paid the start has one.
        phases = startup_phases.from_log_file(ctx["log"]) if startup_s else None
        row = cell_row(
            **base,
            index=cell.index,
            server_key=cell.server_key,
            status=status,
            startup_s=startup_s,
            startup_phases=phases,
            warmup_s=res.warmup_s,
            measure_s=res.measure_s,
            warmup_valid=res.warmup_valid,
            stopped_by=res.stopped_by,
            rounds=1 + max((r["round"] for r in res.rows), default=-1),
            **est,
            log_path=str(ctx["log"].relative_to(self.store.root)),
            error=problem if problem else (None if status == "ok" else "no valid rows"),
            routing=folded,
            gpu_state=watch.cell_state(first_cell=bool(startup_s)),
            finished=now(),
        )
        return row

    def _write(self, cell: Cell, row: Mapping[str, Any]) -> None:
        checked = cell_row(**row)  # checked again: the bookend was added after the row was built
        self.store.append(CELLS, checked)
        self.progress.cell_done(cell, checked)
        self._inert(cell, checked)

    def _inert(self, cell: Cell, row: Mapping[str, Any]) -> None:
        """Said as soon as a cell shows it (the arm's first cell at a point), not after the run: an
        arm whose patched function was never reached or never answered differently. With
        --fail-fast the run stops here, its row written."""
        if row.get("status") != "ok" or cell.arm == self.cfg.arms[0].name:
            return  # the reference is never inert
        found = patch_evidence.cell_findings(row)
        key = (cell.arm, Point.of(row))
        if not found or key in self.inert_said:
            return
        self.inert_said.add(key)
        what = "; ".join(patch_evidence.describe(f) for f in found)
        msg = f"arm {cell.arm} is inert at {key[1]} ({cell.cell_id}): {what} in this server's processes"
        if self.cfg.run.fail_fast:
            raise InertArm(f"{msg} (--fail-fast)")
        self.progress.note(f"warning: {msg}: its verdict will read inert (exit 3 unless --allow-inert)")

    def _bookend(self, server: VllmServer, client: CellClient, ctx: dict[str, Any]) -> dict[str, Any]:
        """The server's first depth again, at the end of its life (e2e/stats/bookends.py). Its rows carry
        phase "bookend" (never counted). A server that dies here loses only its bookend: the cells it
        measured are done."""
        wl, st, op = self.cfg.workload, self.cfg.stats, ctx["opening"]
        ident = {"server_attempt": ctx["tag"], "cell_id": op["cell"].cell_id, "depth": op["cell"].depth}
        opening = bookends.round_ms(op["rows"], wl.long_tokens, wl.short_tokens)
        if not wl.bookend_rounds:
            return bookends.untested("workload.bookend_rounds = 0", **ident)
        if not bookends.testable(opening.size, wl.bookend_rounds, st.bookend_alpha):
            return bookends.untested(
                f"not measured: {opening.size} valid opening and {wl.bookend_rounds} closing rounds cannot reach "
                f"p < {st.bookend_alpha:g} (smallest p {bookends.smallest_p(opening.size, wl.bookend_rounds):.3g})",
                opening_rounds=int(opening.size),
                **ident,
            )
        cell, watch = op["cell"], ctx["watch"]
        base = {
            "cell_id": cell.cell_id,
            "attempt": ctx["tag"],
            "pass": cell.pass_,
            "arm": cell.arm,
            "depth": cell.depth,
            **({"concurrency": cell.concurrency} if cell.concurrency > 1 else {}),
            "phase": "bookend",
        }

        def closing_round(k: int) -> None:
            if k:
                watch.checkpoint(f"bookend {k - 1}")

        watch.begin_bookend()
        try:
            res = self._rounds(
                cell,
                client,
                ctx,
                wl.model_copy(update={"rounds": wl.bookend_rounds, "warmup_rounds": 0}),
                emit=lambda row: self.store.append(REQUESTS, request_row(**base, **row)),
                phase=lambda p: self.progress.phase(cell, "bookend"),
                between_rounds=closing_round,
            )
        except ServerGone as exc:
            return bookends.untested(f"the server failed during the closing rounds: {exc}", **ident)
        if not server.alive():
            return bookends.untested("the server exited during the closing rounds", **ident)
        if watch.bookend_foreign:
            held = list(watch.bookend_foreign.values())
            return bookends.untested(
                f"another process on the GPU during the closing rounds: {describe(held)}", foreign=held, **ident
            )
        closing = bookends.round_ms(res.rows, wl.long_tokens, wl.short_tokens)
        out = bookends.evaluate(opening.tolist(), closing.tolist(), st.bookend_alpha, st.bookend_min_step_pct, **ident)
        if out["status"] == "non-stationary":
            self.progress.note(
                f"warning: server {cell.server_key} (attempt {ctx['tag']}) is non-stationary: its "
                f"first depth ({cell.cell_id}) moved {out['step_pct']:+.1f} % between its opening "
                f"and its close (p {out['p_value']:.2g})"
            )
        return out

    def _batch(self, cell: Cell, server: VllmServer, ctx: dict[str, Any]) -> BatchClient:
        """The server's c connections for rounds at the cell's concurrency c (made once per server and c)."""
        clients: dict[int, BatchClient] = ctx.setdefault("batch", {})
        if cell.concurrency not in clients:
            clients[cell.concurrency] = BatchClient(
                server.base_url, server.api_key, self.cfg.server.request_timeout_s, cell.concurrency
            )
        return clients[cell.concurrency]

    def _rounds(self, cell: Cell, client: CellClient, ctx: dict[str, Any], wl: WorkloadCfg, **kw: Any) -> CellResult:
        """A cell's rounds: one request at a time over fresh prompts (measure.py) when the run's route
        is "fresh" (every c is 1); c together over primed prompts (batch.py) at every point otherwise."""
        if self.cfg.workload.route == "fresh":
            return measure_cell(client, cell.depth, wl, self.sampler, **kw)
        return measure_batch_cell(
            ctx["batch"][cell.concurrency],
            cell.depth,
            wl,
            self.sampler,
            min_effect_pct=self.cfg.stats.min_effect_pct,
            **kw,
        )

    def _record_failed(
        self, cell: Cell, ctx: dict[str, Any], error: str, tail: str, left: list[int], folded: dict[str, Any]
    ) -> CellRowDict:
        row = cell_row(
            **cell.identity(),  # its design point too: a failed cell at c > 1 read as batch 1 without it
            attempt=ctx["tag"],
            index=cell.index,
            server_key=cell.server_key,
            status="failed",
            startup_s=None,
            decode_ms_per_token=None,
            server_decode_ms_per_token=None,
            error=error,
            log_tail=tail,
            leftover_pids=left,
            log_path=str(ctx["log"].relative_to(self.store.root)),
            routing=folded,
            gpu_state=ctx["watch"].cell_state(first_cell=True),
            finished=now(),
        )
        self.store.append(CELLS, row)
        self.progress.cell_done(cell, row)
        return row
