"""The run loop: plan -> (server, measurement) per cell -> rows on disk.

Every finished cell, ok or failed, gets exactly one row in cells.jsonl naming its final attempt;
request rows are appended as measured. An interrupted run can be resumed: cells with a row are never
repeated, the rest run from scratch on a fresh server.
"""
from __future__ import annotations

import hashlib
import secrets
import signal
import sys
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

from e2e import arms, manifest as mf
from e2e.config import ArmCfg, Config, config_to_dict
from e2e.errors import UserError
from e2e.estimate import cell_estimate
from e2e.measure import CellClient, ServerGone, TokenSampler, measure_cell
from e2e.plan import Cell
from e2e.progress import Progress
from e2e.server import ServerFailure, ServerSpec, VllmServer, port_in_use, tail
from e2e.store import CELLS, REQUESTS, RunStore
from e2e.twin import read_stamp


def make_sampler(cfg: Config) -> TokenSampler:
    """Checked before a run folder exists: a model we cannot draw prompts for is bad input."""
    return TokenSampler.for_model(cfg.model.path, cfg.workload.seed, cfg.model.vocab_size)


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def compile_cache_env(cfg: Config, arm: ArmCfg, run_root: Path) -> dict[str, str]:
    """One vLLM cache root per arm and interpreter: an arm's later cells reuse its compiled graphs
    (cheaper starts), but no arm ever loads what another arm compiled."""
    if cfg.server.compile_cache != "per-arm":
        return {}
    python = arm.python or cfg.server.python or sys.executable
    tag = hashlib.sha256(python.encode()).hexdigest()[:8]
    return {"VLLM_CACHE_ROOT": str(Path(run_root).resolve() / "vllm-cache" / f"{arm.name}-{tag}")}


def server_spec(cfg: Config, arm: ArmCfg, record_dir: Path | None, run_root: Path | None = None) -> ServerSpec:
    s = cfg.server
    env = {**(compile_cache_env(cfg, arm, run_root) if run_root else {}), **s.env, **arm.env}
    if record_dir is not None:
        env.update(arms.plugin_env(arm, record_dir, cfg))
    return ServerSpec(
        python=arm.python or s.python or sys.executable,
        model=cfg.model.path, tokenizer=cfg.model.tokenizer,
        tensor_parallel_size=s.tensor_parallel_size, max_model_len=cfg.model.max_model_len,
        cuda_graphs=s.cuda_graphs, compilation_config=s.compilation_config,
        gpu_memory_utilization=s.gpu_memory_utilization, launcher=s.launcher,
        extra_args=tuple(s.extra_args) + tuple(arm.args), env=env)


def build_manifest(cfg: Config, run_id: str, cells: list[Cell]) -> dict[str, Any]:
    pythons = {a.name: (a.python or cfg.server.python or sys.executable) for a in cfg.arms}
    installs = {p: mf.installation(p) for p in sorted(set(pythons.values()))}
    arm_info = {}
    for a in cfg.arms:
        spec = server_spec(cfg, a, Path("<cell-dir>"))
        arm_info[a.name] = {
            "server_argv": mf.redact_args(spec.argv(0)),
            "api_key": "random per server, passed as VLLM_API_KEY (never in argv or logs)",
            "env": mf.redact_env({k: v for k, v in spec.env.items()}),
            "patches": list(a.patches),
            "installation": installs[pythons[a.name]],
        }
    return {
        "schema_version": 1, "run_id": run_id, "tool": "vllm-e2e-bench",
        "started": now(), "ended": None, "status": "running",
        "config": config_to_dict(cfg), "n_cells": len(cells),
        "server_mode": cfg.server.mode,
        "model": {"path": cfg.model.path, "twin_of": cfg.model.twin_of,
                  "twin_stamp": read_stamp(Path(cfg.model.path))},
        "arms": arm_info, "host": mf.host(), "gpu": mf.gpu_driver(),
        "git": mf.git_commit(mf.project_root()), "environment": mf.relevant_env(),
        "resumes": [],
    }


class _Terminate(BaseException):
    """SIGTERM, turned into an exception so the same cleanup as Ctrl-C runs."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminate()


INTERRUPTS = (KeyboardInterrupt, _Terminate)


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside the block SIGTERM raises _Terminate, so the cleanup written for Ctrl-C (servers and
    lm-eval stopped, manifest marked interrupted) runs for it too instead of an instant death."""
    old = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


class Runner:
    def __init__(self, cfg: Config, store: RunStore, cells: list[Cell], progress: Progress,
                 sampler: TokenSampler, stop_rule_factory: Callable[[Config], Any] | None = None):
        self.cfg = cfg
        self.store = store
        self.cells = cells
        self.progress = progress
        self.stop_rule = stop_rule_factory(cfg) if stop_rule_factory else None
        self.sampler = sampler
        self.results: list[dict[str, Any]] = []

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> list[dict[str, Any]]:
        done = self.store.finished_cell_ids()
        todo = [c for c in self.cells if c.cell_id not in done]
        self.progress.start(total=len(self.cells), done=len(self.cells) - len(todo))
        try:
            with sigterm_as_interrupt():
                for group in _groups(todo):
                    self._run_group(group)
        finally:
            self.progress.stop()
        return self.results

    def _run_group(self, group: list[Cell]) -> None:
        """Cells that share one server (one cell in fresh mode), retried on a fresh server."""
        arm = self.cfg.arm(group[0].arm)
        remaining = list(group)
        failures: list[str] = []
        for attempt in range(self.cfg.run.retries + 1):
            tag = f"{attempt}-{secrets.token_hex(3)}"
            log = self.store.log_path(f"{group[0].server_key}.a{attempt}")
            record_dir = self.store.cell_dir(group[0].server_key) / f"records-a{attempt}"
            spec = server_spec(self.cfg, arm, record_dir, self.store.root)
            # A tag in every server process's environment: leak checks find them by it.
            spec.env["E2E_SERVER_TAG"] = f"{self.store.root.resolve()}::{group[0].server_key}"
            server = VllmServer(spec, log, self.cfg.server.startup_timeout_s, self.cfg.server.stop_timeout_s)
            try:
                self.progress.phase(remaining[0], "starting server")
                with server:
                    startup_s = server.startup_s
                    client = CellClient(server.base_url, server.api_key, self.cfg.server.request_timeout_s)
                    try:
                        while remaining:
                            cell = remaining[0]
                            self._measure(cell, arm, server, client, tag, startup_s, log, record_dir)
                            remaining.pop(0)
                            startup_s = 0.0  # later cells on a shared server paid no start
                    finally:
                        client.close()
                self._check_teardown(server)
                return
            except (ServerFailure, ServerGone) as exc:
                left = server.stop()
                log_tail = getattr(exc, "log_tail", "") or tail(log)
                failures.append(f"attempt {attempt}: {exc}")
                if attempt < self.cfg.run.retries:
                    self.progress.note(f"{remaining[0].cell_id}: {exc}; retrying on a fresh server")
                    continue
                routing = arms.fold_records(record_dir, arm, wait_s=0)  # keeps a worker's plugin error
                for cell in remaining:
                    self._record_failed(cell, tag, log, "; ".join(failures), log_tail, left, routing)
                if self.cfg.run.fail_fast:
                    raise UserError(f"cell {remaining[0].cell_id} failed (--fail-fast): {exc}") from None
                return

    def _measure(self, cell: Cell, arm: ArmCfg, server: VllmServer, client: CellClient, tag: str,
                 startup_s: float, log: Path, record_dir: Path) -> None:
        base = {"cell_id": cell.cell_id, "attempt": tag, "pass": cell.pass_, "arm": cell.arm,
                "depth": cell.depth}
        res = measure_cell(
            client, cell.depth, self.cfg.workload, self.sampler,
            emit=lambda row: self.store.append(REQUESTS, {**base, **row}),
            phase=lambda p: self.progress.phase(cell, p),
            stop_rule=self.stop_rule)
        if not server.alive():
            raise ServerGone("server exited during the cell")
        wl = self.cfg.workload
        est = cell_estimate(res.rows, wl.long_tokens, wl.short_tokens)
        routing = arms.fold_records(record_dir, arm)
        problem = arms.patch_problem(routing, arm)
        status = "ok" if est["decode_ms_per_token"] is not None and problem is None else "failed"
        row = {**base, "index": cell.index, "server_key": cell.server_key, "status": status,
               "startup_s": startup_s, "warmup_s": res.warmup_s, "measure_s": res.measure_s,
               "warmup_valid": res.warmup_valid, "stopped_by": res.stopped_by,
               "rounds": 1 + max((r["round"] for r in res.rows), default=-1), **est,
               "log_path": str(log.relative_to(self.store.root)),
               "error": problem if problem else (None if status == "ok" else "no valid rows"),
               "routing": routing, "finished": now()}
        self.store.append(CELLS, row)
        self.results.append(row)
        self.progress.cell_done(cell, row)

    def _record_failed(self, cell: Cell, tag: str, log: Path, error: str, tail: str, left: list[int],
                       routing: dict[str, Any]) -> None:
        row = {"cell_id": cell.cell_id, "attempt": tag, "pass": cell.pass_, "arm": cell.arm,
               "depth": cell.depth, "index": cell.index, "server_key": cell.server_key,
               "status": "failed", "startup_s": None, "decode_ms_per_token": None,
               "server_decode_ms_per_token": None, "error": error, "log_tail": tail,
               "leftover_pids": left, "log_path": str(log.relative_to(self.store.root)),
               "routing": routing, "finished": now()}
        self.store.append(CELLS, row)
        self.results.append(row)
        self.progress.cell_done(cell, row)

    def _check_teardown(self, server: VllmServer) -> None:
        left = server.stop()
        if left or port_in_use(server.port):
            self.progress.note(f"warning: after teardown pids {left} / port {server.port} still in use")


def _groups(cells: list[Cell]) -> list[list[Cell]]:
    out: list[list[Cell]] = []
    for c in cells:
        if out and out[-1][0].server_key == c.server_key:
            out[-1].append(c)
        else:
            out.append([c])
    return out

