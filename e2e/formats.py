"""The on-disk formats of a run folder and the files derived from it: one version per file kind,
the timestamp format, and (below) the typed rows."""
from __future__ import annotations

from datetime import datetime, timezone


def now() -> str:
    """The timestamp every file of a run uses: UTC, ISO 8601, seconds."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")

# One version per file kind. A reader refuses a version it does not know (formats.check_version).
VERSIONS = {
    "manifest": 1,        # manifest.json
    "plan": 1,            # plan.json (a list: the version is the manifest's)
    "cells": 1,           # cells.jsonl rows
    "requests": 1,        # requests.jsonl rows
    "summary": 1,         # summary.json / summary.csv / comparisons.csv / report.md
    "compare": 1,         # compare --json
    "history": 1,         # history.csv
    "gsm8k-unit": 1,      # gsm8k/<arm>/r<k>/unit.json
    "gsm8k-summary": 1,   # gsm8k/summary.json
}
