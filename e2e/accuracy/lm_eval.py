"""lm-eval as a child process against one server: its command line and environment, watching it
while the server lives, and reading its per-question samples back.

lm-eval runs as a subprocess (`python -m lm_eval run`), not in-process: it imports torch, datasets and
transformers and reconfigures logging for the whole process, so keeping it in a child keeps the
harness lean and unaffected; the server's API key reaches only that child's environment; a hung
evaluation is killed with its whole process group; and its output lands in a log file of its own.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from e2e.design.config import Config
from e2e.safety.redact import scrub_file
from e2e.safety.safe_io import open_append, write_atomic
from e2e.serve.server import SERVED_NAME, ServerFailure, VllmServer, stop_group, tail


def lm_eval_argv(
    cfg: Config, base_url: str, tasks_dir: Path, tasks: list[str], out_dir: Path, limit: int | None
) -> list[str]:
    """The lm-eval command. No secret in it: the API key travels as OPENAI_API_KEY in the env.

    tokenizer_backend=none sends plain strings, so the server tokenizes as it always does (BOS
    included where the model wants one) and nothing is looked up on the hub.
    """
    g = cfg.gsm8k
    model = "local-chat-completions" if g.chat else "local-completions"
    endpoint = "/v1/chat/completions" if g.chat else "/v1/completions"
    model_args = ",".join(
        [
            f"model={SERVED_NAME}",
            f"base_url={base_url}{endpoint}",
            f"num_concurrent={g.num_concurrent}",
            "max_retries=3",
            "tokenizer_backend=none",
            "tokenized_requests=False",
            f"max_gen_toks={g.max_gen_toks}",
            f"timeout={int(cfg.server.request_timeout_s)}",
        ]
    )
    argv = [
        sys.executable,
        "-m",
        "lm_eval",
        "run",
        "--model",
        model,
        "--model_args",
        model_args,
        "--tasks",
        ",".join(tasks),
        "--include_path",
        str(tasks_dir),
        "--output_path",
        str(out_dir),
        "--log_samples",
        "--batch_size",
        "1",
    ]
    if g.chat:
        argv += ["--apply_chat_template"]
    if limit is not None:
        argv += ["--limit", str(limit)]
    return argv


def lm_eval_env(api_key: str, cache_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "OPENAI_API_KEY": api_key,
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_DATASETS_CACHE": str(cache_dir),
            "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def _progress_text(log: Path) -> str:
    """The last tqdm fragment lm-eval wrote (its bars end with carriage returns, not newlines)."""
    text = tail(log, 5)
    frags = [f.strip() for f in text.replace("\r", "\n").split("\n") if "%|" in f]
    return frags[-1][:100] if frags else ""


def run_lm_eval(argv: list[str], env: dict[str, str], log: Path, server: VllmServer, say: Any) -> tuple[int, float]:
    """Run lm-eval while watching the server; returns (exit status, seconds)."""
    t0 = time.monotonic()
    last_note = t0
    with open_append(log) as f:  # never through a link planted in the run folder
        proc = subprocess.Popen(
            argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
        )
    try:
        while proc.poll() is None:
            if not server.alive():
                stop_group(proc, 10.0)
                raise ServerFailure("server exited during the evaluation", server.log_tail())
            if time.monotonic() - last_note > 30:
                last_note = time.monotonic()
                say(f"    lm-eval {time.monotonic() - t0:.0f} s  {_progress_text(log)}")
            time.sleep(0.5)
    finally:
        stop_group(proc, 10.0)  # a no-op after a normal exit; Ctrl-C and SIGTERM land here too
    return proc.returncode, time.monotonic() - t0


def redact_tree(root: Path, secrets: str | Iterable[str]) -> list[str]:
    """Replace the API key and the server's other secret values wherever they appear under root
    (they should appear nowhere). Returns the files that held one."""
    secrets = [secrets] if isinstance(secrets, str) else list(secrets)
    return [
        str(p.relative_to(root))
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.endswith(".gz") and scrub_file(p, secrets)
    ]


def _questions_from_samples(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """lm-eval logs one record per (question, filter); fold them into one row per question."""
    by_doc: dict[int, dict[str, Any]] = {}
    for s in samples:
        doc_id = int(s["doc_id"])
        row = by_doc.setdefault(
            doc_id,
            {
                "doc_id": doc_id,
                "doc_hash": s.get("doc_hash"),
                "prompt_hash": s.get("prompt_hash"),
                "target": s.get("target"),
                "response": _first(s.get("resps")),
                "filters": {},
            },
        )
        row["filters"][s["filter"]] = {
            "extracted": _first(s.get("filtered_resps")),
            "correct": bool(s.get("exact_match")),
        }
    return [by_doc[k] for k in sorted(by_doc)]


def _first(x: Any) -> Any:
    while isinstance(x, list):
        if not x:
            return None
        x = x[0]
    return x


def collect(unit_dir: Path, tasks: list[str]) -> dict[str, Any]:
    """Write questions-<task>.jsonl from lm-eval's samples; gzip the raw samples; per-task accuracy."""
    out: dict[str, Any] = {}
    for task in tasks:
        files = sorted((unit_dir / "lm_eval").rglob(f"samples_{task}_*.jsonl"))
        if not files:
            raise RuntimeError(f"lm-eval wrote no samples for {task}")
        samples = [json.loads(line) for line in files[-1].read_text().splitlines() if line.strip()]
        rows = _questions_from_samples(samples)
        qfile = unit_dir / f"questions-{task}.jsonl"
        write_atomic(qfile, "".join(json.dumps(r) + "\n" for r in rows))
        for f in files:
            with open(f, "rb") as src, gzip.open(f.with_name(f.name + ".gz"), "wb") as dst:
                shutil.copyfileobj(src, dst)
            f.unlink()
        filters = sorted({k for r in rows for k in r["filters"]})
        correct = {flt: sum(bool(r["filters"].get(flt, {}).get("correct")) for r in rows) for flt in filters}
        out[task] = {
            "n": len(rows),
            "questions": qfile.name,
            "correct": correct,
            "accuracy": {flt: k / len(rows) for flt, k in correct.items()},
        }
    return out
