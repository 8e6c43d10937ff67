"""A run folder's life, from creation to its final status: a new run (start), a resumed one
(resume), and the stand-alone gsm8k sign-off's folder (gsm8k); in each, the manifest and plan, the
cells (through an executor: only e2e/run/executors/ import the run loop), the sign-off, the report, and
last the final status and exit status in the manifest, also after a crash or an interrupt. The CLI
(e2e/cli/commands/run.py, gsm8k.py) parses and calls this; the store (e2e/rundir/store.py) names and guards the folder.

Exit status (e2e/stats/outcomes.py's run_status): 0 done (and gsm8k passed, when it ran), 1 done with
failed cells or a failed sign-off, 3 done but the sign-off could not decide (inconclusive or
incomplete) or an arm is inert (its patch changed nothing; --allow-inert: not 3), 130 interrupted (servers stopped, rows kept, resumable with --resume), 2 an error.
Latency verdicts do not set the status: a run states them; `compare` turns them into a regression
status. The console ends with the answer: the verdict table, the sign-off, the exit status's meaning.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e import exits
from e2e.accuracy import gsm8k_step
from e2e.design.config import (
    Config,
    batch_warnings,
    config_difference,
    config_from_manifest,
    load_config,
    with_overrides,
)
from e2e.design.plan import Cell, next_pass
from e2e.errors import UserError
from e2e.report.answer import say_the_answer
from e2e.report.progress import Progress, make_console
from e2e.run import preflight
from e2e.run.executors import Executor, ExecutorOptions, LocalExecutor
from e2e.run.executors import create as create_executor
from e2e.run.measure import TokenSampler
from e2e.run.run_manifest import build_manifest
from e2e.rundir import identity, patch_evidence
from e2e.rundir import manifest as mf
from e2e.rundir.formats import now
from e2e.rundir.manifest_model import check_unchanged
from e2e.rundir.store import RunStore, run_folder
from e2e.safety.interrupts import INTERRUPTS, sigterm_as_interrupt
from e2e.safety.redact import secret_values
from e2e.serve import live_servers
from e2e.serve.launch import check_launchable, server_spec
from e2e.stats import outcomes


@dataclass(frozen=True)
class Options:
    """What the command line says about a run beyond its config."""

    progress: bool = True
    gsm8k: bool = True  # run the sign-off when the config enables it
    gsm8k_limit: int | None = None
    gsm8k_aa: str | None = None
    executor: ExecutorOptions = field(default_factory=ExecutorOptions)  # where the cells run
    allow_inert: bool = False  # an inert arm does not make the run exit 3


def _preflight(cfg: Config, opts: Options) -> TokenSampler:
    """Everything the run would refuse, before a run folder exists and before any server starts:
    the same check `run --dry-run` makes (e2e/run/preflight.py); the prompts' sampler it built."""
    found = preflight.require(cfg, opts.gsm8k, opts.gsm8k_limit, opts.gsm8k_aa, opts.executor.kind == "local")
    assert found.sampler is not None  # require() refused a model without one
    return found.sampler


def start(cfg: Config, cells: list[Cell], root: Path, console: Any, opts: Options) -> int:
    """A new run folder at root (refused if it exists and is not empty), then execute()."""
    sampler = _preflight(cfg, opts)  # bad input before a run folder exists
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
            store.write_manifest(
                {**m, "executors": [ex.describe()], **({"orphans_stopped": stopped} if stopped else {})}
            )
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
        sampler = _preflight(cfg, opts)
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
            resumes: list[Any] = m["resumes"] if isinstance(m.get("resumes"), list) else []
            # The code that runs the rest: its own commit and content, not the one that started the run.
            m["resumes"] = resumes + [
                {
                    "started": now(),
                    "git": mf.git_commit(mf.project_root()),
                    "code": identity.identify(mf.project_root(), m.get("config") or {}),
                    "status_before": m.get("status"),
                }
            ]
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


def execute(
    cfg: Config,
    store: RunStore,
    cells: list[Cell],
    console: Any,
    opts: Options,
    sampler: TokenSampler,
    executor: Executor | None = None,
) -> int:
    ex = executor or LocalExecutor()
    try:
        return _execute(cfg, store, cells, console, opts, sampler, ex)
    except Exception as exc:  # never leave the manifest saying "running" (cli.main reports it)
        _mark_stopped(store, exc)
        raise
    finally:
        _record_observed(store, ex)


def _record_observed(store: RunStore, ex: Executor) -> None:
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


def _execute(
    cfg: Config, store: RunStore, cells: list[Cell], console: Any, opts: Options, sampler: TokenSampler, ex: Executor
) -> int:
    from e2e.report.write import write_report

    console.print(f"run folder: {store.root}")
    for w in batch_warnings(cfg):
        console.print(w, markup=False)
    t0 = time.monotonic()
    try:
        with sigterm_as_interrupt():  # also between the passes of adaptive replication
            ex.run(cfg, store, cells, Progress(console, enabled=opts.progress), sampler)
            if cfg.run.target_ci_pct is not None:
                _replicate(cfg, store, cells, console, opts, sampler, t0, ex)
    except INTERRUPTS:
        finish(store, "interrupted", exits.INTERRUPTED)
        console.print(
            f"interrupted: servers stopped; rows so far are in {store.root}; continue with --resume {store.root}"
        )
        return exits.INTERRUPTED
    failed = [r for r in store.cells() if r["status"] == "failed"]  # this call's and earlier ones' (resume)
    verdict = None
    if cfg.gsm8k.enabled and opts.gsm8k:  # the accuracy sign-off, each arm on a fresh server
        try:
            with sigterm_as_interrupt():
                g = gsm8k_step.run_gsm8k(
                    cfg, store.root, [x.name for x in cfg.arms], opts.gsm8k_limit, aa=opts.gsm8k_aa, console=console
                )
        except INTERRUPTS:
            finish(store, "interrupted", exits.INTERRUPTED)
            console.print(f"interrupted during gsm8k; latency rows are complete in {store.root}")
            return exits.INTERRUPTED
        verdict = g["verdict"]
        store.update_manifest(gsm8k_verdict=verdict)
    # an arm whose patch changed nothing (e2e/rundir/patch_evidence.py) cannot decide, unless allowed
    inert = patch_evidence.inert_points(store.cells(), cfg.arms[0].name)
    status = outcomes.run_status(bool(failed), verdict, inert=bool(inert) and not opts.allow_inert)
    finish(store, "complete" if not failed else "complete-with-failures", status)
    write_report(store.root)
    s = written_summary(store.root)
    if s is not None:
        _record_estimator(store, s["run"])
    say_the_answer(console, store.root, status, s)
    return status


def written_summary(root: Path) -> dict[str, Any] | None:
    """The summary.json the report just wrote (e2e/report/summary.py), or None when none was written."""
    try:
        s: dict[str, Any] = json.loads((root / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return s


def _record_estimator(store: RunStore, run: dict[str, Any]) -> None:
    """The estimator that decided the run (e2e/stats/estimate.py, chosen by the analysis from the rows) and
    why, in the manifest beside the report's own statement of it."""
    store.update_manifest(
        estimator={
            "name": run.get("estimator"),
            "why": run.get("estimator_note"),
            "definition": run.get("estimator_definition"),
            "by_point": run.get("estimator_by_point"),  # per arm and point: which one and why
        }
    )


def _replicate(
    cfg: Config,
    store: RunStore,
    cells: list[Cell],
    console: Any,
    opts: Options,
    sampler: TokenSampler,
    t0: float,
    ex: Executor,
) -> None:
    """Adaptive replication, in two stages. The planned passes are the pilot; from its rows
    (e2e/analysis/adaptive.py) the variance model and the measured costs choose the extra passes and the
    rounds per depth of their cells that bring every arm ratio's 95 % interval within
    +-run.target_ci_pct % at the least GPU time (within run.max_passes and run.max_minutes), and
    those run. There is no second look: a stop that waited for a narrow interval would select on a
    lucky variance estimate and cover less than 95 % (the conformance table shows the two-stage
    rule's coverage). The manifest's `replication` records the choice, its costs and its outcome."""
    from e2e.analysis.adaptive import plan_extra, with_outcome

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


def finish(store: RunStore, status: str, exit_status: int, **more: Any) -> None:
    """The folder's final word: its status, end time and exit status, in the manifest."""
    store.update_manifest(status=status, ended=now(), exit_status=exit_status, **more)


def _mark_stopped(store: RunStore, exc: Exception) -> None:
    """Best effort: the run stopped on an error (exit 2); a folder that cannot be written keeps its
    manifest. A run whose measurement had finished keeps its status; the error and exit are added."""
    try:
        error = (f"{type(exc).__name__}: {exc}".splitlines() or [""])[0][:300]
        code = getattr(exc, "exit_code", exits.BAD_INPUT)
        if store.manifest().get("status") == "running":
            finish(store, "stopped-on-error", code, error=error)
        else:
            store.update_manifest(exit_status=code, error=error)
    except Exception:
        pass


# -- the stand-alone sign-off's folder -----------------------------------------------------------
# What --config must agree on with an existing run's own config: what decides its servers and the
# sign-off. (The latency workload and stats do not matter here.)
SAME_SECTIONS = ("model", "server", "arms", "gsm8k")


def gsm8k_config(run_dir: Path | None, config: str | None, default_config: str, overrides: dict[str, Any]) -> Config:
    """An existing run folder's own config (its manifest's), else --config (or the default); then
    the flags. A --config that differs from the run's own in what decides the sign-off is refused."""
    if run_dir is None or not (run_dir / "manifest.json").is_file():
        return load_config(config or default_config, overrides)
    own = config_from_manifest(RunStore.open_existing(run_dir).manifest(), f"{run_dir}/manifest.json")
    if config is not None:
        diff = config_difference(load_config(config), own, SAME_SECTIONS)
        if diff:
            raise UserError(
                f"--config {config} differs from the config {run_dir} recorded (at {diff}); "
                "drop --config: gsm8k --run-dir uses the run's own"
            )
    return with_overrides(own, overrides, f"{run_dir}/manifest.json")


def gsm8k(
    cfg: Config,
    run_dir: Path | None,
    run_id: str | None,
    arms: list[str] | None,
    limit: int | None,
    aa: str | None,
    assets_dir: Path,
) -> int:
    """`run_e2e.py gsm8k`: the sign-off into run_dir (an existing run's, or a new folder), or into a
    new folder <out>/<run-id>. A folder made for the sign-off gets its manifest, plan and final
    status (reused later with --run-dir, it is finalised again); an existing run's gets
    gsm8k_verdict and gsm8k_exit_status beside its own status. 0 pass, 1 fail, 3 inconclusive or
    incomplete, 2 bad input, 130 interrupted."""
    names = arms or [x.name for x in cfg.arms]
    gsm8k_step.preflight(cfg, names, limit, aa)
    if run_dir is not None:
        root, fresh = run_dir, not (run_dir / "manifest.json").is_file()
    else:
        root, fresh = run_folder(cfg.run.out, run_id, cfg.name, "-gsm8k"), True
    check_launchable(cfg, names + ([aa] if aa else []))  # before a run folder exists
    store = RunStore.create(root) if fresh else RunStore.open_existing(root)
    console = make_console(stderr=True)
    with store:
        own = fresh or store.manifest().get("command") == "gsm8k"  # the sign-off's own folder
        if fresh:
            m = build_manifest(cfg, root.name, [])
            m["command"] = "gsm8k"
            store.write_manifest(m)
            store.write_plan([])
        elif own:
            store.update_manifest(status="running", ended=None)
        console.print(f"run folder: {root}")
        try:
            with sigterm_as_interrupt():
                summary = gsm8k_step.run_gsm8k(cfg, root, names, limit, aa, console, assets_dir)
        except INTERRUPTS:
            if own:
                finish(store, "interrupted", exits.INTERRUPTED)
            console.print(
                f"interrupted: servers stopped; finished units are kept in {root}/gsm8k "
                "and reused when the same command runs again with --run-dir"
            )
            return exits.INTERRUPTED
        except Exception as exc:
            if own:
                _mark_stopped(store, exc)
            raise
        status = outcomes.status_of([summary["verdict"]], outcomes.SIGNOFF)
        if own:
            finish(store, "complete", status, gsm8k_verdict=summary["verdict"])
        else:
            store.update_manifest(gsm8k_verdict=summary["verdict"], gsm8k_exit_status=status)
    console.print(f"exit status {status}: {exits.MEANING[status]}")
    return status
