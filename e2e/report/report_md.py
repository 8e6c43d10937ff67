"""report.md: a run's summary (e2e/report/summary.py) as markdown, section by section, from the summary
alone (so report.md can be re-rendered from summary.json). Every number comes from the summary;
nothing here computes a statistic. The sections live by subject: the head and facts
(e2e/report/md_facts.py), the results (md_results.py, md_load.py for a run above batch 1), the machine (md_machine.py), the gsm8k sign-off
(md_gsm8k.py, which renders gsm8k.md too); each table from its declaration in e2e/report/summary.py."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from e2e.report.md_facts import facts, head, latency, no_cells
from e2e.report.md_gsm8k import gsm8k
from e2e.report.md_gsm8k import gsm8k_markdown as gsm8k_markdown  # gsm8k.md's, where the sign-off runs
from e2e.report.md_load import load
from e2e.report.md_machine import floor, gpu_state, routing, starts
from e2e.report.md_profile import profile
from e2e.report.md_results import agreement, cells, slots, verdicts

Section = Callable[[dict[str, Any]], list[str]]


def markdown_report(s: dict[str, Any]) -> str:
    """report.md of a summary (summary.json as read back). A folder without latency cells (the
    stand-alone gsm8k sign-off's) gets the head, its facts and the sign-off only."""
    md: list[str] = []
    for section in SECTIONS if latency(s) else (head, facts, no_cells, gsm8k, warnings):
        md += section(s)
    return "\n".join(md)


def warnings(s: dict[str, Any]) -> list[str]:
    md = [f"## Warnings ({len(s['warnings'])})", ""]
    md += [f"- {w}" for w in s["warnings"]] or ["None."]
    return md + [""]


SECTIONS: list[Section] = [
    head,
    facts,
    verdicts,
    load,
    cells,
    agreement,
    slots,
    gpu_state,
    floor,
    starts,
    routing,
    profile,
    gsm8k,
    warnings,
]


def as_json(s: dict[str, Any]) -> dict[str, Any]:
    """The summary as summary.json holds it (keys strings, tuples lists): what report.md is rendered from."""
    out: dict[str, Any] = json.loads(json.dumps(s, default=str))
    return out
