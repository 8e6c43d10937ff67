"""A run from start to report: create or reopen the run folder, write the manifest and plan, run
the cells (e2e/runner.py), then the gsm8k sign-off, then the report. The CLI calls this; nothing
else imports the run loop.

Exit status: 0 done (and gsm8k passed, when it ran), 1 done with failed cells or a failed sign-off,
3 done but the sign-off could not decide (inconclusive or incomplete), 130 interrupted (servers
stopped, rows kept, resumable with --resume). Latency verdicts do not set the status: a run states
them; `compare` turns them into a regression status.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e import live_servers
from e2e import manifest as mf
from e2e.config import Config, config_from_manifest
from e2e.executors import ExecutorOptions, LocalExecutor, create as create_executor
from e2e.formats import now
from e2e.interrupts import INTERRUPTS, sigterm_as_interrupt
from e2e.launch import build_manifest, check_launchable, server_spec
from e2e.manifest_model import check_unchanged
from e2e.plan import Cell, next_pass
from e2e.progress import Progress, cells_table
from e2e.redact import secret_values
from e2e.runner import make_sampler
from e2e.store import RunStore


@dataclass(frozen=True)
class Options:
    """What the command line says about a run beyond its config."""
    progress: bool = True
    gsm8k: bool = True                 # run the sign-off when the config enables it
    gsm8k_limit: int | None = None
    gsm8k_aa: str | None = None
    executor: ExecutorOptions = field(default_factory=ExecutorOptions)  # where the cells run


def start(cfg: Config, cells: list[Cell], root: Path, console: Any, opts: Options) -> int:
    """A new run folder at root (refused if it exists and is not empty), then execute()."""
    sampler = make_sampler(cfg)  # bad input before a run folder exists
    check_launchable(cfg)
    if root.exists() and any(root.iterdir()):
        RunStore.create(root)  # its one-line refusal, before a cluster is started for nothing
    # Before a cluster, a bandwidth probe or a cell shares this host with what a dead harness left.
    stopped = _stop_orphans(console)
    ex = create_executor(opts.executor)
    try:
        ex.prepare(cfg, cells)  # a cluster that cannot give one answer per arm: refused here
        store = RunStore.create(root)
        with store:
            m = build_manifest(cfg, root.name, cells)
            store.write_manifest({**m, "executors": [ex.describe()],
                                  **({"orphans_stopped": stopped} if stopped else {})})
            store.write_plan([c.to_dict() for c in cells])
            store.save_model_config(cfg.model.path)
            try:
                return execute(cfg, store, cells, console, opts, sampler, ex)
            finally:
                _none_left(store, console)
    finally:
        ex.close()


def resume(run_dir: Path, console: Any, opts: Options) -> int:
    """Finish the missing cells of a run folder with the config it recorded."""
    store = RunStore.open_existing(run_dir)
    with store:
        m = store.manifest()
        check_unchanged(m, f"{run_dir}/manifest.json")  # an edited config: refused before anything is written
        cfg = config_from_manifest(m, f"{run_dir}/manifest.json")
        store.cells(), store.requests()  # damaged rows: one line now, before anything is appended
        cells = [Cell.from_dict(c) for c in store.plan()]
        sampler = make_sampler(cfg)
        check_launchable(cfg)
        # We hold its lock, so the harness whose manifest says "running" is gone (SIGKILL, a crash
        # of the machine): say so, on disk first. Then stop what it (or any dead harness) left.
        died = m.get("status") == "running"
        if died:
            m.update(status="harness-died", harness_died={"found": now()})
            store.write_manifest(m)
            console.print(f"{run_dir}: the harness of this run died (its manifest said running); resuming")
        stopped = _stop_orphans(console, store, cfg)
        ex = create_executor(opts.executor)
        try:
            # Resume works across executors; an arm's vLLM must stay the one its rows came from.
            ex.prepare(cfg, cells, m)
            resumes = m.get("resumes") if isinstance(m.get("resumes"), list) else []
            # The code that runs the rest: its own commit, not the one that started the run.
            m["resumes"] = resumes + [{"started": now(), "git": mf.git_commit(mf.project_root()),
                                       "status_before": m.get("status")}]
            if stopped:
                m["orphans_stopped"] = (m.get("orphans_stopped") or []) + stopped
            # A run from before the executors list ran locally.
            m["executors"] = (m.get("executors") or [{"kind": "local"}]) + [ex.describe()]
            m["status"] = "running"
            store.write_manifest(m)
            try:
                return execute(cfg, store, cells, console, opts, sampler, ex)
            finally:
                _none_left(store, console)
        finally:
            ex.close()


def _stop_orphans(console: Any, store: RunStore | None = None, cfg: Config | None = None) -> list[dict[str, Any]]:
    """What dead harnesses left running on this host (and, on a resume of `store`, anything of this
    run, and what its records name): stopped, one line on the console; the entries go into the
    manifest."""
    stopped = live_servers.stop_orphans(str(store.root.resolve()) if store else None)
    if store is not None and cfg is not None:
        stopped += live_servers.clear_records(store.root, _server_secrets(cfg))
    if stopped:
        console.print(live_servers.describe(stopped))
    return stopped


def _none_left(store: RunStore, console: Any) -> None:
    """The session's last word: a server of this run still running here (nothing should be) is killed."""
    left = live_servers.stop_mine(str(store.root.resolve()))
    if left:
        console.print(f"warning: killed server process(es) {left} still running at the end of the run")


def _server_secrets(cfg: Config) -> set[str]:
    """What the run's servers may have printed that no log may keep (the API key aside: by digest)."""
    out: set[str] = set()
    for arm in cfg.arms:
        spec = server_spec(cfg, arm, None)
        out |= secret_values({**os.environ, **spec.env}, spec.argv(0))
    return out


def execute(cfg: Config, store: RunStore, cells: list[Cell], console: Any, opts: Options,
            sampler: Any, executor: Any = None) -> int:
    ex = executor or LocalExecutor()
    try:
        return _execute(cfg, store, cells, console, opts, sampler, ex)
    except Exception as exc:  # never leave the manifest saying "running" (cli.main reports it)
        _mark_stopped(store, exc)
        raise
    finally:
        _record_observed(store, ex)


def _record_observed(store: RunStore, ex: Any) -> None:
    """What the executor saw (cells at once, the slots' final balance) into its manifest entry."""
    seen = ex.observed()
    if not seen:
        return
    try:
        m = store.manifest()
        entries = m.get("executors") or []
        if entries:
            entries[-1].update(seen)
            store.write_manifest(m)
    except Exception:
        pass  # best effort, like _mark_stopped: a folder that cannot be written keeps its manifest


def _execute(cfg: Config, store: RunStore, cells: list[Cell], console: Any, opts: Options,
             sampler: Any, ex: Any) -> int:
    from e2e.report import write_report

    console.print(f"run folder: {store.root}")
    t0 = time.monotonic()
    try:
        with sigterm_as_interrupt():  # also between the passes of adaptive replication
            ex.run(cfg, store, cells, Progress(console, enabled=opts.progress), sampler)
            if cfg.run.target_ci_pct is not None:
                _replicate(cfg, store, cells, console, opts, sampler, t0, ex)
    except INTERRUPTS:
        store.update_manifest(status="interrupted", ended=now())
        console.print(f"interrupted: servers stopped; rows so far are in {store.root}; "
                      f"continue with --resume {store.root}")
        return 130
    rows = store.cells()  # every finished cell, this call's and earlier ones' (resume)
    failed = [r for r in rows if r["status"] != "ok"]
    console.print(cells_table(rows, title=f"{cfg.name}: decode ms per token"))
    verdict = None
    if cfg.gsm8k.enabled and opts.gsm8k:  # the accuracy sign-off, each arm on a fresh server
        from e2e.accuracy.command import run_gsm8k
        try:
            with sigterm_as_interrupt():
                g = run_gsm8k(cfg, store.root, [x.name for x in cfg.arms], opts.gsm8k_limit,
                              aa=opts.gsm8k_aa, console=console)
        except INTERRUPTS:
            store.update_manifest(status="interrupted", ended=now())
            console.print(f"interrupted during gsm8k; latency rows are complete in {store.root}")
            return 130
        verdict = g["verdict"]
        store.update_manifest(gsm8k_verdict=verdict)
        console.print(f"gsm8k sign-off: {verdict} ({store.root / 'gsm8k' / 'gsm8k.md'})")
    store.update_manifest(status="complete" if not failed else "complete-with-failures", ended=now())
    write_report(store.root)
    console.print(f"report: {store.root / 'report.md'}")
    if failed or verdict == "fail":
        return 1
    return 0 if verdict in (None, "pass") else 3


def _replicate(cfg: Config, store: RunStore, cells: list[Cell], console: Any, opts: Options,
               sampler: Any, t0: float, ex: Any) -> None:
    """Adaptive replication, in two stages. The planned passes are the pilot; from its rows
    (e2e/adaptive.py) the variance model and the measured costs choose the extra passes and the
    rounds per depth of their cells that bring every arm ratio's 95 % interval within
    +-run.target_ci_pct % at the least GPU time (within run.max_passes and run.max_minutes), and
    those run. There is no second look: a stop that waited for a narrow interval would select on a
    lucky variance estimate and cover less than 95 % (the conformance table shows the two-stage
    rule's coverage). The manifest's `replication` records the choice, its costs and its outcome."""
    from e2e.adaptive import plan_extra, with_outcome

    done = store.manifest().get("replication") or {}
    if str(done.get("rule", "")).startswith("two-stage"):
        # a resumed run: the allocation was chosen once and its cells are in the plan (run above)
        store.update_manifest(replication=with_outcome(done, store.root))
        return
    passes = max(c.pass_ for c in cells)
    decision = plan_extra(cfg, store.root, passes, elapsed_min=(time.monotonic() - t0) / 60)
    store.update_manifest(replication=decision.to_dict())
    console.print(f"adaptive replication: {decision.summary()}")
    if not decision.extra_passes:
        return
    for _ in range(decision.extra_passes):
        cells += next_pass(cfg, cells, decision.rounds)
    store.write_plan([c.to_dict() for c in cells])
    ex.run(cfg, store, cells, Progress(console, enabled=opts.progress), sampler)
    store.update_manifest(replication=decision.outcome(store.root))


def _mark_stopped(store: RunStore, exc: Exception) -> None:
    """Best effort: the run stopped on an error; a folder that cannot be written keeps its manifest."""
    try:
        if store.manifest().get("status") == "running":
            store.update_manifest(status="stopped-on-error", ended=now(),
                                  error=(f"{type(exc).__name__}: {exc}".splitlines() or [""])[0][:300])
    except Exception:
        pass
