"""`--executor ray`: the run's server groups as Ray tasks, this process the only writer of the run folder.

Each group (a cell in fresh mode, an arm-pass in per-arm-pass mode) is planned onto a slot
(e2e/design/plan.py assign_slots: every arm spread evenly over slots and passes), runs there when its
slot is free and its host has fewer than --max-per-host cells running, and sends its rows to an
inbox that this process drains into the run folder as they arrive (e2e/run/executors/node_side.py).

Faults. A task lost with its node or worker is one attempt of its group: the group's remaining
cells are retried on a slot on another node, while retries are left, its rows never counted (the
cell row names the attempt that measured it). Ctrl-C (or SIGTERM) cancels every task, which stops
its servers through the run loop's own teardown, then every node is swept for processes carrying
this run's E2E_SERVER_TAG (ray_cleanup.py). A second Ctrl-C during that is held back.
"""

from __future__ import annotations

import secrets
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

try:
    import ray
except ImportError:  # still importable without the extra (a clean install); create() names the package
    ray = None  # type: ignore[assignment]

from e2e.design.config import Config
from e2e.design.plan import Cell, assign_slots, server_groups, slot_balance
from e2e.errors import UserError
from e2e.gpu.gpu_state import GpuBusy
from e2e.run.executors import ray_cluster as rc
from e2e.run.executors.options import ExecutorOptions
from e2e.run.executors.ray_cleanup import exposure_warnings, stop_orphans_everywhere, sweep_group, sweep_nodes
from e2e.run.executors.ray_tasks import run_group
from e2e.run.executors.slots import Slot, least_loaded
from e2e.run.executors.versions import check_one_version, earlier
from e2e.rundir.formats import CellRowDict, cell_row, now
from e2e.rundir.store import CELLS, REQUESTS, RunStore
from e2e.safety.interrupts import INTERRUPTS, held
from e2e.safety.redact import secret_values
from e2e.serve import live_servers
from e2e.serve.launch import server_spec

if TYPE_CHECKING:
    from e2e.report.progress import Progress
    from e2e.run.measure import TokenSampler


@dataclass
class Flight:
    """One group's task, from launch to its end."""

    cells: list[Cell]
    slot: Slot
    offset: int  # attempts the group used before this task
    prior: list[str]  # those attempts' reasons ("attempt 0: ...")
    tid: str = ""
    ref: Any = None
    started: int = 0  # server starts seen (each one attempt)
    at_once: int = 1  # most cells running at once on this host during the task
    reasons: list[str] = field(default_factory=list)


def lost_row(c: Cell, attempt: str, error: str, slot: str, host: str, at_once: int) -> CellRowDict:
    """The failed row of a cell whose node was lost past the retries: the cell's own identity, its
    design point included (a cell at c > 1 without `concurrency` would read as batch 1)."""
    return cell_row(
        **c.identity(),
        attempt=attempt,
        index=c.index,
        server_key=c.server_key,
        status="failed",
        error=error,
        slot=slot,
        slot_host=host,
        executor="ray",
        at_once=at_once,
        finished=now(),
    )


class RayExecutor:
    kind = "ray"

    def __init__(self, opts: ExecutorOptions):
        self.opts = opts
        self.connected = False
        self.slots: list[Slot] = []
        self.nodes: dict[str, dict[str, Any]] = {}
        self.balance: dict[str, Any] = {}
        self.most_at_once = self.most_per_host = 0
        self.used_nodes: set[str] = set()
        self.gpu_busy: set[str] = set()  # slots whose GPU another process held: no more groups there
        self.security: dict[str, Any] = {}
        self.swept_orphans = False

    # -- before the run folder exists ---------------------------------------------------------
    def prepare(self, cfg: Config, cells: list[Cell], manifest: dict[str, Any] | None = None) -> None:
        o = self.opts
        self.started_cluster = rc.connect(o.ray_address)
        self.connected = True
        self.address = o.ray_address or "local (started for this run)"
        self.security = rc.exposure(self.started_cluster)  # checked on the running cluster
        self.slots = rc.find_slots(cfg, o.max_per_host, o.max_slots, o.cpus_per_cell)
        self.nodes = rc.probe_nodes(cfg, self.slots)
        check_one_version(
            cfg, earlier(manifest) + [(f"node {n['name']} ({n['host']})", n["arm_vllm"]) for n in self.nodes.values()]
        )
        self.balance = self._balance(cfg, cells)
        if not self.balance["balanced"] and o.balance == "strict":
            raise UserError(f"{self.balance['problem']} (--slot-balance strict): {self.balance['suggest']}")
        me = ray.get_runtime_context().get_node_id()
        opts: dict[str, Any] = {"num_cpus": 0}
        if me in rc.alive_node_ids():  # rows wait in this node's memory, not on a node that can die
            opts["scheduling_strategy"] = rc.on_node(me)
        from ray.util.queue import Queue

        self.inbox = Queue(actor_options=opts)

    def _balance(self, cfg: Config, cells: list[Cell]) -> dict[str, Any]:
        arms = [a.name for a in cfg.arms]
        self.assignment = assign_slots(cells, len(self.slots), arms)
        return slot_balance(cells, self.assignment, [s.name for s in self.slots])

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "ray",
            "started": now(),
            "address": self.address,
            "ray_version": ray.__version__,
            "security": self.security,
            "max_per_host": self.opts.max_per_host,
            "max_slots": self.opts.max_slots,
            "slots": [s.to_dict() for s in self.slots],
            "balance": self.balance,
            "nodes": self.nodes,
        }

    def observed(self) -> dict[str, Any]:
        return {"max_at_once": self.most_at_once, "max_at_once_per_host": self.most_per_host, "balance": self.balance}

    # -- the run ------------------------------------------------------------------------------
    def run(
        self, cfg: Config, store: RunStore, cells: list[Cell], progress: Progress, sampler: TokenSampler
    ) -> list[CellRowDict]:
        self.cfg, self.store, self.progress = cfg, store, progress
        self.run_root = str(Path(store.root).resolve())
        self.by_index = {c.index: c for c in cells}
        self.finished = store.finished_cell_ids()
        self.balance = self._balance(cfg, cells)  # adaptive replication adds passes: judged again
        if not self.balance["balanced"]:
            progress.note(f"warning: {self.balance['problem']}; {self.balance['suggest']}")
        self.sampler_ref = ray.put(sampler)
        self.pending = [
            Flight(g, self.slots[self.assignment[g[0].server_key]], 0, [])
            for g in server_groups([c for c in cells if c.cell_id not in self.finished])
        ]
        self.flights: dict[str, Flight] = {}
        self.written: list[CellRowDict] = []
        progress.start(total=len(cells), done=len(cells) - sum(len(f.cells) for f in self.pending))
        if not self.swept_orphans:
            self.swept_orphans = True
            for warning in exposure_warnings(self.started_cluster, self.security):
                progress.note(warning)
            self._stop_orphans()
        try:
            while self.pending or self.flights:
                self._launch_ready()
                refs = [f.ref for f in self.flights.values()]
                ready, _ = ray.wait(refs, num_returns=1, timeout=0.25) if refs else ([], [])
                self._drain()
                for ref in ready:
                    self._ended(next(f for f in self.flights.values() if f.ref == ref))
                if self.pending and not self.flights and not self._launchable():
                    raise UserError("no slot is left on a live node: stopping; --resume when the cluster is back")
        except BaseException as exc:
            self._stop_all(f"{type(exc).__name__}")
            raise
        finally:
            progress.stop()
        self._sweep_all()
        return self.written

    def _launchable(self) -> bool:
        alive = rc.alive_node_ids()
        return any(f.slot.node_id in alive for f in self.pending)

    def _launch_ready(self) -> None:
        busy = {f.slot.name for f in self.flights.values()}
        per_host = Counter(f.slot.host for f in self.flights.values())
        for f in list(self.pending):  # plan order: each slot runs its groups in the plan's order
            if f.slot.name in busy or per_host[f.slot.host] >= self.opts.max_per_host:
                continue
            self.pending.remove(f)
            busy.add(f.slot.name)
            per_host[f.slot.host] += 1
            self._launch(f)
            for other in self.flights.values():
                if other.slot.host == f.slot.host:
                    other.at_once = max(other.at_once, per_host[f.slot.host])
        self.most_at_once = max(self.most_at_once, len(self.flights))
        self.most_per_host = max([self.most_per_host, *per_host.values()])

    def _launch(self, f: Flight) -> None:
        key = f.cells[0].server_key
        f.tid = f"{key}.o{f.offset}.{secrets.token_hex(3)}"
        cfg = self.cfg.model_copy(
            update={"run": self.cfg.run.model_copy(update={"retries": self.cfg.run.retries - f.offset})}
        )
        job = {
            "cfg": cfg,
            "cells": f.cells,
            "run_root": self.run_root,
            "task_dir": f.tid,
            "offset": f.offset,
            "gpus": list(f.slot.gpus),
            "cwd": str(Path.cwd()),
            "harness": live_servers.owner(),
        }  # the owner in every server's environment
        f.ref = run_group.options(
            num_cpus=f.slot.cpus, num_gpus=len(f.slot.gpus), scheduling_strategy=rc.on_node(f.slot.node_id)
        ).remote(job, self.sampler_ref, self.inbox)
        self.flights[f.tid] = f
        self.used_nodes.add(f.slot.node_id)
        self.progress.note(
            f"{key}: on slot {f.slot.name} ({f.slot.host})" + (f", attempt {f.offset}" if f.offset else "")
        )

    # -- what the tasks send --------------------------------------------------------------------
    def _drain(self) -> None:
        n = self.inbox.qsize()
        for tid, kind, *rest in self.inbox.get_nowait_batch(n) if n else []:
            f = self.flights.get(tid)
            if f is None:
                continue  # a task already handled (it cannot send after its end: puts are synchronous)
            if kind == REQUESTS:
                self.store.append(REQUESTS, rest[0])
            elif kind == CELLS:
                self._cell(f, rest[0])
            elif kind == "void":  # the node's store.void_rows: only the driver writes the run folder
                self.store.void_rows(*rest)
            elif kind == "phase":
                cell, phase = self.by_index[rest[0]], rest[1]
                if phase == "starting server":
                    f.started += 1
                self.progress.phase(cell, phase)
            elif kind == "note":
                self.progress.note(rest[0])
                if "; retrying on a fresh server" in rest[0]:
                    why = rest[0].split(": ", 1)[-1].rsplit("; retrying", 1)[0]
                    f.reasons.append(f"attempt {f.offset + f.started - 1}: {why}")
            elif kind == "files":
                self._files(rest[0])

    def _cell(self, f: Flight, row: dict[str, Any]) -> None:
        if row.get("status") != "ok" and f.prior:
            row["error"] = "; ".join(f.prior + [row.get("error") or ""])
        self._write(
            cell_row(**{**row, "slot": f.slot.name, "slot_host": f.slot.host, "executor": "ray", "at_once": f.at_once})
        )

    def _write(self, row: CellRowDict) -> None:
        self.store.append(CELLS, row)
        self.finished.add(row["cell_id"])
        self.written.append(row)
        # every row this executor writes is of one of its planned cells, so it names the cell's index
        self.progress.cell_done(self.by_index[cast(int, row["index"])], row)

    def _files(self, files: dict[str, bytes]) -> None:
        root = Path(self.store.root)
        for rel, data in files.items():
            path = root / rel
            if root.resolve() not in path.resolve().parents:
                continue  # a name from a node never leaves the run folder
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            except OSError as exc:
                raise UserError(f"results folder {root} is not writable: {exc.strerror}") from None

    # -- a task's end -----------------------------------------------------------------------------
    def _ended(self, f: Flight) -> None:
        del self.flights[f.tid]
        try:
            ray.get(f.ref)
            return
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None) or exc  # ray.get raises an instance of the cause's class too
            if isinstance(cause, GpuBusy):
                return self._gpu_busy(f, str(cause))
            if isinstance(cause, UserError):  # --fail-fast, a full disk on the node: the run stops
                raise UserError(str(cause)) from None
            if not isinstance(cause, INTERRUPTS):
                raise  # a harness error on the node: its traceback, as a local run would show
            why = "interrupted on its node"
        except ray.exceptions.RayError as exc:
            why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            why = f"{type(exc).__name__}: {why}"
        self._lost(f, why)

    def _lost(self, f: Flight, why: str) -> None:
        """The task is gone with its worker or node: that attempt is used, its rows never count."""
        left = [c for c in f.cells if c.cell_id not in self.finished]
        used = max(f.started, 1)
        reasons = (
            f.prior
            + f.reasons
            + [f"attempt {f.offset + used - 1}: task lost on slot {f.slot.name} ({f.slot.host}): {why}"]
        )
        self._sweep_node(f)
        if not left:
            return
        offset = f.offset + used
        alive = rc.alive_node_ids()
        if offset > self.cfg.run.retries or not any(s.node_id in alive for s in self.slots):
            for c in left:
                self._write(lost_row(c, f"{offset - 1}-lost", "; ".join(reasons), f.slot.name, f.slot.host, f.at_once))
            if self.cfg.run.fail_fast:
                raise UserError(f"cell {left[0].cell_id} failed (--fail-fast): {reasons[-1]}")
            return
        self.progress.note(f"{left[0].server_key}: {reasons[-1]}; retrying on another node")
        self.pending.insert(0, Flight(left, self._elsewhere(f.slot, alive), offset, reasons))
        for p in self.pending:  # groups planned on a dead node move to live ones
            if p.slot.node_id not in alive:
                p.slot = self._elsewhere(p.slot, alive)

    def _gpu_busy(self, f: Flight, why: str) -> None:
        """The slot's GPU held another process before a server start (found on its node, e2e/gpu/gpu_state.py):
        the slot takes no more groups in this run, and this group's cells (and those planned there)
        go to other slots. Only servers that did start used an attempt."""
        self.gpu_busy.add(f.slot.name)
        self.progress.note(f"{f.cells[0].server_key}: slot {f.slot.name} ({f.slot.host}) skipped: {why}")
        left = [c for c in f.cells if c.cell_id not in self.finished]
        if left:
            self.pending.insert(0, Flight(left, f.slot, f.offset + f.started, f.prior + f.reasons))
        skip = self.gpu_busy | {s.name for s in self.slots if s.node_id not in rc.alive_node_ids()}
        for p in self.pending:
            if p.slot.name in self.gpu_busy:
                slot = least_loaded(self.slots, skip, Counter(q.slot.name for q in self.pending))
                if slot is None:
                    raise UserError(
                        f"every slot's GPUs hold another process ({why}): stopping; --resume when they are free"
                    )
                p.slot = slot

    def _elsewhere(self, slot: Slot, alive: set[str]) -> Slot:
        """A live slot, on another node when there is one, the least loaded first."""
        load = Counter(p.slot.name for p in self.pending)
        live = [s for s in self.slots if s.node_id in alive and s.name not in self.gpu_busy]
        other = [s for s in live if s.node_id != slot.node_id] or live
        return min(other, key=lambda s: load[s.name]) if other else slot

    def _sweep_node(self, f: Flight) -> None:
        if f.slot.node_id not in rc.alive_node_ids():
            return  # the node is gone, and its processes with it
        arm = self.cfg.arm(f.cells[0].arm)
        hidden = tuple(secret_values({**self.cfg.server.env, **arm.env}, server_spec(self.cfg, arm, None).argv(0)))
        got = sweep_group(self.run_root, f.slot.node_id, f.cells[0].server_key, hidden)
        if got is None:
            return
        self._files(got["files"])
        if got["killed"]:
            self.progress.note(
                f"{f.cells[0].server_key}: stopped {len(got['killed'])} process(es) its lost "
                f"task left on {f.slot.name}" + (f"; still running: {got['left']}" if got["left"] else "")
            )

    # -- before the first task --------------------------------------------------------------------
    def _stop_orphans(self) -> None:
        """Before the first task: on every live node, what a dead harness left, stopped; the driver
        reports it and records it in the manifest."""
        names = {nid: n.get("name", nid[:8]) for nid, n in self.nodes.items()}
        found = stop_orphans_everywhere(self.run_root, names, self.progress.note)
        if found:
            earlier = self.store.manifest().get("orphans_stopped") or []
            self.store.update_manifest(orphans_stopped=earlier + found)

    # -- stopping -----------------------------------------------------------------------------------
    def _stop_all(self, why: str) -> None:
        """Cancel every task (its run loop stops its servers), keep draining what they still send,
        then sweep every node. Signals that arrive meanwhile are held (we are stopping already)."""
        with held(redeliver=False) as h:
            self.pending = []
            for f in self.flights.values():
                ray.cancel(f.ref)
            deadline = time.monotonic() + self.cfg.server.stop_timeout_s + 60
            while self.flights and time.monotonic() < deadline:
                ready, _ = ray.wait([f.ref for f in self.flights.values()], num_returns=len(self.flights), timeout=0.5)
                try:
                    self._drain()
                except Exception:
                    pass  # a full disk now must not stop the servers' teardown
                for f in [f for f in self.flights.values() if f.ref in ready]:
                    del self.flights[f.tid]
            for f in self.flights.values():
                ray.cancel(f.ref, force=True)
            self.flights = {}
            self._sweep_all()
        if h.got:
            self.progress.note(f"stopping ({why}): {len(h.got)} more signal(s) held back until the servers stopped")

    def _sweep_all(self, remove_scratch: bool = False) -> None:
        for nid, killed in sweep_nodes(self.run_root, self.used_nodes, remove_scratch).items():
            if killed and hasattr(self, "progress"):
                self.progress.note(
                    f"swept {len(killed)} leftover server process(es) on node "
                    f"{self.nodes.get(nid, {}).get('name', nid[:8])}"
                )

    def close(self) -> None:
        if not self.connected:
            return
        try:
            if hasattr(self, "run_root"):
                self._sweep_all(remove_scratch=True)
        finally:
            ray.shutdown()
            rc.restore_env()
            if self.started_cluster:
                live_servers.forget_cluster()
            self.connected = False
