"""gsm8k/summary.json: every unit, every comparison (all filters; the primary one decides), the
verdict. The statistics are e2e/stats/signoff.py's; every number here comes from unit files. (gsm8k.md is
its rendering: e2e/report/report_md.py's gsm8k_markdown, from tables declared in e2e/report/summary.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from e2e.accuracy.tasks import FULL_SIZE, primary_filter
from e2e.accuracy.unit import Unit
from e2e.design.config import Config
from e2e.rundir.formats import VERSIONS, now
from e2e.stats import signoff

SCHEMA_VERSION = VERSIONS["gsm8k-summary"]


def read_answers(unit_dir: Path, task: str, flt: str) -> list[signoff.Answer]:
    rows = [json.loads(x) for x in (unit_dir / f"questions-{task}.jsonl").read_text().splitlines() if x]
    out = []
    for r in rows:
        f = r["filters"].get(flt, {})
        out.append(
            signoff.Answer(
                doc_id=r["doc_id"],
                correct=bool(f.get("correct")),
                response=r.get("response") or "",
                extracted=f.get("extracted"),
                doc_hash=r.get("doc_hash"),
            )
        )
    return out


DEFINITIONS = {
    "accuracy": "exact_match under the named lm-eval filter: correct / questions",
    "interval": "two-sided Wilson score interval at confidence 1 - alpha (scipy binomtest.proportion_ci)",
    "a / b": "the two servers compared (a_server, b_server: <arm>/r<k>); A is the baseline",
    "a_only / b_only": "questions right under A only / under B only (the discordant pairs)",
    "change": "accuracy(B) - accuracy(A), with Tango's two-sided paired score interval",
    "drop_upper / drop_lower": "one-sided (1 - alpha) bounds of the paired drop accuracy(A) - accuracy(B): "
    "Tango's score statistic with a critical value calibrated to exact size",
    "mcnemar_p": "two-sided exact McNemar test (reported; it does not decide)",
    "verdict": "non-inferiority: pass iff drop_upper <= max_accuracy_drop; fail iff drop_lower > "
    "max_accuracy_drop; else inconclusive. Overall: pass iff every arm-vs-baseline comparison "
    "on its task's primary filter passes; fail if any fails; incomplete if a unit is missing",
    "text_differ": "questions whose generated text differs at all between the two servers",
    "extracted_differ": "questions whose extracted answer differs between the two servers",
    "aa": "the same arm on two fresh servers: the serving stack's own nondeterminism; each arm pair's "
    "discordant and text_differ counts are tested against it (one-sided Fisher exact): answers "
    "that flip both ways cancel in McNemar but are a real change. Reported; it does not decide",
}


def planning(margin: float, alpha: float, n: int | None) -> dict[str, Any]:
    """What a sample of n questions can show about the margin, said before anything runs."""
    need = signoff.min_questions(margin, alpha)
    out: dict[str, Any] = {
        "questions": n or FULL_SIZE,
        "min_questions_for_a_pass": need,
        "questions_for_80pct_power": {
            f"{d:.0%} discordance": signoff.questions_needed(margin, alpha, 0.8, d) for d in (0.02, 0.05)
        },
    }
    if need is None or (n or FULL_SIZE) < need:
        out["too_small"] = (
            f"{n or FULL_SIZE} questions cannot show a drop below {100 * margin:.1f} points: even "
            f"with no discordant answer a pass needs {need} or more; the sign-off can only say "
            "inconclusive or fail"
        )
    return out


def summarize(
    cfg: Config,
    run_dir: Path,
    units: list[Unit],
    records: dict[Unit, dict[str, Any]],
    tasks: list[str],
    settings: dict[str, Any],
    aa: str | None,
    data: dict[str, Any],
    lm_eval_version: str,
) -> dict[str, Any]:
    """summary.json: every unit, every comparison (all filters; the primary one decides), the verdict."""
    g = cfg.gsm8k
    base = units[0]
    pairs: list[tuple[str, Unit, Unit]] = [("ab", base, u) for u in units[1:] if u.replicate == 1]
    if aa is not None:
        pairs.append(("aa", Unit(aa, 1), Unit(aa, 2)))
    comparisons = [c for kind, ua, ub in pairs for c in _compare_pair(cfg, run_dir, kind, ua, ub, records, tasks)]
    _add_aa_baselines(comparisons, g.alpha)
    verdict = signoff.overall_verdict(c["verdict"] for c in comparisons if c["primary"] and c["kind"] == "ab")
    plan = planning(g.max_accuracy_drop, g.alpha, settings["limit"])
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "gsm8k-signoff",
        "created": now(),
        "description": "Paired gsm8k sign-off of vLLM arms: each arm on its own fresh server, scored "
        "by lm-eval per question; arms compared with the baseline arm question by "
        "question (non-inferiority of the paired drop against max_accuracy_drop) and an "
        "optional A/A pair as the noise baseline.",
        "verdict": verdict,
        "warnings": _warnings(plan, settings["limit"], len(units)),
        "config": cfg.name,
        "model": cfg.model.path,
        "baseline_arm": base.arm,
        "aa_arm": aa,
        "tasks": tasks,
        "primary_filter": {t: primary_filter(t) for t in tasks},
        "questions": settings["limit"] or FULL_SIZE,
        "limit": settings["limit"],
        "settings": {
            **settings,
            "alpha": g.alpha,
            "max_accuracy_drop": g.max_accuracy_drop,
            "lm_eval_model": "local-chat-completions" if g.chat else "local-completions",
            "tokenizer_backend": "none",
            "lm_eval_version": lm_eval_version,
            "decoding": "greedy (temperature 0), lm-eval's generation_kwargs and stop strings",
        },
        "data": data,
        "definitions": DEFINITIONS,
        "planning": plan,
        "units": [_unit_summary(u, records[u], g.alpha) for u in units],
        "comparisons": comparisons,
        # Every path in this file is relative to the folder holding it (<run>/gsm8k/).
        "links": {"relative_to": "gsm8k/", "markdown": "gsm8k.md", "tasks": "tasks/"},
    }


def _compare_pair(
    cfg: Config, run_dir: Path, kind: str, ua: Unit, ub: Unit, records: dict[Unit, dict[str, Any]], tasks: list[str]
) -> list[dict[str, Any]]:
    """Two servers compared question by question: per task, every filter either reported."""
    g = cfg.gsm8k
    out = []
    for task in tasks:
        flts = sorted(
            set(records[ua].get("tasks", {}).get(task, {}).get("accuracy", {}))
            | set(records[ub].get("tasks", {}).get(task, {}).get("accuracy", {}))
        ) or [primary_filter(task)]
        for flt in flts:
            c: dict[str, Any] = {
                "kind": kind,
                "task": task,
                "filter": flt,
                "primary": flt == primary_filter(task),
                "a_server": ua.rel,
                "b_server": ub.rel,
            }
            bad = [u.label for u in (ua, ub) if records[u].get("status") != "ok"]
            if bad:
                c.update(verdict="incomplete", reasons=[f"no result from {', '.join(bad)}"])
            else:
                try:
                    c.update(
                        signoff.compare(
                            read_answers(run_dir / "gsm8k" / ua.rel, task, flt),
                            read_answers(run_dir / "gsm8k" / ub.rel, task, flt),
                            alpha=g.alpha,
                            max_accuracy_drop=g.max_accuracy_drop,
                        )
                    )
                except (ValueError, OSError, KeyError) as exc:
                    c.update(verdict="incomplete", reasons=[f"not comparable: {exc}"])
            out.append(c)
    return out


def _add_aa_baselines(comparisons: list[dict[str, Any]], alpha: float) -> None:
    """Each arm comparison beside the A/A pair's on the same task and filter (reported; it does not decide)."""
    aa_by_task = {(c["task"], c["filter"]): c for c in comparisons if c["kind"] == "aa" and "n" in c}
    for c in comparisons:
        ref = aa_by_task.get((c["task"], c["filter"]))
        if c["kind"] == "ab" and ref is not None and "n" in c:
            c["aa_baseline"] = {
                "text_differ": ref["text_differ"],
                "discordant": ref["discordant"],
                "text_differ_excess": c["text_differ"] - ref["text_differ"],
                "excess": signoff.aa_check(c, ref, alpha),
            }


def _warnings(plan: dict[str, Any], limit: int | None, n_units: int) -> list[str]:
    out = [plan["too_small"]] if "too_small" in plan else []
    if limit is not None:
        out.append(f"--limit {limit}: only the first {limit} of {FULL_SIZE} questions")
    if n_units < 2:
        out.append("one server only: nothing to compare (give two arms or --aa ARM)")
    return out


def _unit_summary(u: Unit, rec: dict[str, Any], alpha: float) -> dict[str, Any]:
    """One server's line: status, timings, and per task and filter its accuracy with interval."""
    tasks = {}
    for task, t in rec.get("tasks", {}).items():
        tasks[task] = {
            "n": t["n"],
            "questions": f"{u.rel}/{t['questions']}",
            "accuracy": {
                flt: signoff.accuracy_block(k, t["n"], 1 - alpha, "wilson") for flt, k in t["correct"].items()
            },
        }
    return {
        "arm": u.arm,
        "replicate": u.replicate,
        "dir": u.rel,
        "status": rec.get("status"),
        "error": rec.get("error"),
        "startup_s": rec.get("server", {}).get("startup_s"),
        "eval_s": rec.get("lm_eval", {}).get("eval_s"),
        "tasks": tasks,
        "unit": f"{u.rel}/unit.json",
        "server_log": f"{u.rel}/{rec.get('server', {}).get('log')}",
        "lm_eval_log": f"{u.rel}/lm_eval.log",
    }
