"""Find processes a run started, by the E2E_SERVER_TAG every server process inherits."""
from __future__ import annotations

from pathlib import Path

import psutil


def tagged_processes(run_root: Path) -> list[psutil.Process]:
    """Live processes whose E2E_SERVER_TAG names this run folder (servers that should be gone)."""
    prefix = f"{Path(run_root).resolve()}::"
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get("E2E_SERVER_TAG", "").startswith(prefix) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (psutil.Error, OSError):
            continue
    return out
