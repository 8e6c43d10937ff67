"""One gsm8k unit: an arm on its own fresh server, scored by lm-eval; its unit.json.

    <run>/gsm8k/<arm>/r<k>/   r1 for every arm, r2 for the A/A replicate
        unit.json                status, timings, redacted commands, accuracy per task and filter
        questions-<task>.jsonl   one row per question: response, extracted answers, correct or not
        server.a<N>.log, lm_eval.log
        lm_eval/                 lm-eval's own results JSON and its samples (gzipped)

A unit whose unit.json says "ok" with the same settings is reused when run again (resume); a failed
or stale one is moved aside to r<k>.old-<time>, never overwritten.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e2e.accuracy.lm_eval import collect, lm_eval_argv, lm_eval_env, redact_tree, run_lm_eval
from e2e.accuracy.tasks import FULL_SIZE
from e2e.design.config import ArmCfg, Config
from e2e.rundir import routing
from e2e.rundir.formats import VERSIONS, now
from e2e.rundir.store import write_json_atomic
from e2e.safety.redact import redact_args, redact_env, scrub
from e2e.serve.attempts import GaveUp, on_fresh_servers
from e2e.serve.launch import server_spec, start_server
from e2e.serve.server import VllmServer, tail

SCHEMA_VERSION = VERSIONS["gsm8k-unit"]
STEP = "gsm8k"  # a unit's server is tagged <run folder>::gsm8k/<arm>/r<k>, its folder in the run


@dataclass(frozen=True)
class Unit:
    """One fresh server and one lm-eval run: an arm's first server (r1) or its A/A replicate (r2)."""

    arm: str
    replicate: int = 1

    @property
    def rel(self) -> str:
        return f"{self.arm}/r{self.replicate}"

    @property
    def label(self) -> str:
        return f"{self.arm} r{self.replicate}"


def plan_units(arm_names: list[str], aa: str | None) -> list[Unit]:
    """r1 of every arm in order, then the A/A replicate (reusing the arm's r1 when it is listed)."""
    units = [Unit(a) for a in arm_names]
    if aa is not None:
        if aa not in arm_names:
            units.append(Unit(aa))
        units.append(Unit(aa, 2))
    return units


def unit_settings(
    cfg: Config, tasks: list[str], limit: int | None, data_sha: str, arm: str | None = None
) -> dict[str, Any]:
    """What must match for a finished unit to be reused (and for two units to be compared).
    With `arm`, also that arm's server: an edited arm (args, env, patches, interpreter) is run again."""
    g = cfg.gsm8k
    out: dict[str, Any] = {
        "tasks": tasks,
        "limit": limit,
        "chat": g.chat,
        "max_gen_toks": g.max_gen_toks,
        "num_concurrent": g.num_concurrent,
        "model": cfg.model.path,
        "data_sha256": data_sha,
    }
    if arm is not None:
        out["server"] = server_fingerprint(cfg, arm)
    return out


def server_fingerprint(cfg: Config, arm_name: str) -> dict[str, Any]:
    """The arm's server as the reuse check sees it: the command (redacted), a hash of the
    environment it adds (secret values redacted before hashing: no secret, not even hashed, is
    written), its patches and interpreter."""
    arm = cfg.arm(arm_name)
    spec = server_spec(cfg, arm, None)
    env = json.dumps(redact_env(spec.env), sort_keys=True)
    return {
        "argv": redact_args(spec.argv(0)),
        "env_sha256": hashlib.sha256(env.encode()).hexdigest(),
        "patches": list(arm.patches),
        "python": spec.python,
    }


def run_unit(
    cfg: Config,
    unit: Unit,
    unit_dir: Path,
    tasks_dir: Path,
    tasks: list[str],
    limit: int | None,
    settings: dict[str, Any],
    say: Any,
    *,
    run_root: Path,
) -> dict[str, Any]:
    """Start a fresh server for the unit's arm, run lm-eval against it, write unit.json in unit_dir.
    The server is one of the run at run_root (e2e/serve/launch.py start_server): the arm's own
    compile cache in the run folder, the run's tag and its live record."""
    arm = cfg.arm(unit.arm)
    unit_dir.mkdir(parents=True, exist_ok=True)
    rec = _new_record(unit, settings)
    ctx: dict[str, Any] = {}

    def new_server(attempt: int) -> VllmServer:
        ctx["record_dir"] = unit_dir / f"records-a{attempt}"
        log = unit_dir / f"server.a{attempt}.log"
        server = start_server(cfg, arm, run_root, f"{STEP}/{unit.rel}", ctx["record_dir"], log)
        ctx["server"] = server
        rec["server"] = {"argv": redact_args(server.argv), "env": redact_env(dict(server.spec.env)), "log": log.name}
        say(f"gsm8k {unit.label}: starting server")
        return server

    def work(server: VllmServer, attempt: int) -> tuple[int, dict[str, Any]]:
        rec["server"]["startup_s"] = server.startup_s
        argv = lm_eval_argv(cfg, server.base_url, tasks_dir, tasks, unit_dir / "lm_eval", limit)
        rec["lm_eval"] = {"argv": argv, "log": "lm_eval.log"}
        say(
            f"gsm8k {unit.label}: server ready in {server.startup_s:.1f} s; lm-eval "
            f"{','.join(tasks)} on {limit or FULL_SIZE} questions"
        )
        code, secs = _lm_eval_with_own_cache(argv, server, unit_dir / "lm_eval.log", say)
        rec["lm_eval"].update(exit_code=code, eval_s=secs)
        return code, routing.fold_records(ctx["record_dir"], arm)

    def on_retry(attempt: int, exc: Exception) -> None:
        rec["attempts"].append({"attempt": attempt, "error": str(exc)})
        say(f"gsm8k {unit.label}: {exc}; retrying on a fresh server")

    try:
        (code, folded), server, left = on_fresh_servers(new_server, work, cfg.run.retries, on_retry)
        rec["routing"], rec["leftover_pids"] = folded, left
        if redact_tree(unit_dir, server.secrets):
            rec["redacted_key_found"] = True
        _settle(rec, code, folded, arm, unit_dir, tasks, server)
    except GaveUp as g:
        rec["attempts"].append({"attempt": len(g.failures) - 1, "error": str(g.last)})
        rec["error"], rec["log_tail"] = str(g.last), scrub(g.log_tail, ctx["server"].secrets)
    except (RuntimeError, OSError, json.JSONDecodeError) as exc:
        rec["error"] = f"reading lm-eval's output: {exc}"
    rec["finished"] = now()
    write_json_atomic(unit_dir / "unit.json", rec)
    return rec


def _new_record(unit: Unit, settings: dict[str, Any]) -> dict[str, Any]:
    """unit.json as it starts: failed until lm-eval has answered on a server that routed as the arm says."""
    return {
        "schema_version": SCHEMA_VERSION,
        "arm": unit.arm,
        "replicate": unit.replicate,
        "dir": unit.rel,
        "status": "failed",
        "settings": settings,
        "started": now(),
        "attempts": [],
    }


def _lm_eval_with_own_cache(argv: list[str], server: VllmServer, log: Path, say: Any) -> tuple[int, float]:
    """lm-eval against the server, its Hugging Face cache a fresh temporary folder removed after."""
    cache = Path(tempfile.mkdtemp(prefix="e2e-gsm8k-hf-"))
    try:
        return run_lm_eval(argv, lm_eval_env(server.api_key, cache), log, server, say)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _settle(
    rec: dict[str, Any],
    code: int,
    folded: dict[str, Any],
    arm: ArmCfg,
    unit_dir: Path,
    tasks: list[str],
    server: VllmServer,
) -> None:
    """The unit's outcome from lm-eval's exit status and the server's routing: ok, with each task's
    answers, only when lm-eval finished and the arm's patches ran as it says."""
    if code != 0:  # a harness or task error: a fresh server would not change it
        rec["error"] = f"lm-eval exited with status {code}"
        rec["log_tail"] = scrub(tail(unit_dir / "lm_eval.log", 20), server.secrets)
        return
    problem = routing.patch_problem(folded, arm)
    rec["tasks"] = collect(unit_dir, tasks)
    rec["error"] = problem
    rec["status"] = "ok" if problem is None else "failed"


def reusable(unit_dir: Path, settings: dict[str, Any]) -> dict[str, Any] | None:
    path = unit_dir / "unit.json"
    if not path.is_file():
        return None
    try:
        rec: dict[str, Any] = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if (
        rec.get("schema_version") == SCHEMA_VERSION
        and rec.get("status") == "ok"
        and rec.get("settings") == settings
        and all("correct" in rec.get("tasks", {}).get(t, {}) for t in settings["tasks"])
    ):
        return rec
    return None


def move_aside(unit_dir: Path) -> None:
    if unit_dir.exists():
        unit_dir.rename(unit_dir.with_name(f"{unit_dir.name}.old-{time.strftime('%Y%m%d-%H%M%S')}"))
