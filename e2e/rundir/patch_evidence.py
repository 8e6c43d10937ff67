"""Did an arm's patch change anything? The calls of each function its patches change, from the
records of every process of a server (e2e/plugin/recorder.py `patched_calls`), and the rule.

An arm is **inert** at a point (depth, concurrency) when, over its cells there, a patched function
was never called, or - for a gate, whose original answer is recorded beside the patched one - was
called but never answered differently from vLLM's own. Its verdict word is then `inert`, never
`equivalent` (e2e/stats/outcomes.py). Only what was counted is judged: a row without evidence (runs
from before plugin record /2, routing mode off, a user patch that declares no targets) is never inert.
The reference arm is never judged.

In a cell row: routing["patched"] = {"schema": 1, "since_server_start": {...}, "this_cell": {...},
"judged_on": one of the two}, each {function: {"calls", "differing" (None where not compared),
"processes"}}; a server shared by several cells keeps counting, so this_cell is the difference from
the cell before on that server. Under full CUDA graphs a cell is judged on the server's total (a gate
asked at capture decided the replays of every later cell).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from e2e.design.point import Point
from e2e.plugin.contract import BUILTIN_TARGETS, GATES, WRAPS_ATTR

SCHEMA = 1
SINCE_START, THIS_CELL = "since_server_start", "this_cell"
Functions = dict[str, dict[str, Any]]


def fold(recs: list[dict[str, Any]]) -> Functions | None:
    """The patched functions' counts summed over a server's records; None when none recorded any."""
    out: Functions = {}
    for r in recs:
        pc = r.get("patched_calls")
        if not isinstance(pc, dict):
            continue
        for target, v in pc.items():
            f = out.setdefault(target, {"calls": 0, "differing": None, "processes": 0})
            f["calls"] += int(v.get("calls") or 0)
            if v.get("differing") is not None:
                f["differing"] = (f["differing"] or 0) + int(v["differing"])
            f["processes"] += 1
    return out or None


def since(now: Functions, before: Functions | None) -> Functions:
    """The counts of `now` less those of `before` (the same server's previous cell)."""
    out: Functions = {}
    for target, f in now.items():
        b = (before or {}).get(target) or {}
        diff = f.get("differing")
        out[target] = {
            "calls": f["calls"] - int(b.get("calls") or 0),
            "differing": None if diff is None else diff - int(b.get("differing") or 0),
            "processes": f.get("processes"),
        }
    return out


def evidence(
    server_total: Functions | None, this_cell: Functions | None, graphs_full: bool = False
) -> dict[str, Any] | None:
    """routing["patched"] of a cell row, or None when nothing was counted. `judged_on` is this_cell,
    except under full CUDA graphs: replays run no Python, so a gate asked while the graphs were
    captured (the server's start) decided every later cell of that server too."""
    if server_total is None or this_cell is None:
        return None
    basis = SINCE_START if graphs_full else THIS_CELL
    return {"schema": SCHEMA, SINCE_START: server_total, THIS_CELL: this_cell, "judged_on": basis}


def findings(functions: Functions) -> list[dict[str, Any]]:
    """The rule: each patched function never called, or (compared) never answering differently."""
    out = []
    for target, f in sorted(functions.items()):
        calls, diff = int(f.get("calls") or 0), f.get("differing")
        if calls == 0:
            seen = "never called"
        elif diff == 0:
            seen = f"called {calls} times, never answered differently from vLLM's own"
        else:
            continue
        out.append({"function": target, "calls": calls, "differing": diff, "seen": seen})
    return out


def describe(f: dict[str, Any]) -> str:
    """One finding in words: the function's name, its module, what was seen."""
    module, qualname = f["function"].split(":")
    return f"{qualname} ({module}) {f['seen']}"


def cell_findings(row: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The rule over one cell's own counts; None when the row recorded none."""
    got = _this_cell(row)
    return None if got is None else findings(got)


def _this_cell(row: Mapping[str, Any]) -> Functions | None:
    r = row.get("routing")
    p = r.get("patched") if isinstance(r, dict) else None
    basis = p.get("judged_on", THIS_CELL) if isinstance(p, dict) else None
    if not isinstance(p, dict) or p.get("schema") != SCHEMA or not isinstance(p.get(basis), dict):
        return None
    got: Functions = p[basis]
    return got


def point_findings(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]] | None:
    """The rule over an arm's cells at one point (their counts summed); None when none recorded any."""
    total: Functions = {}
    seen = False
    for row in rows:
        got = _this_cell(row)
        if got is None:
            continue
        seen = True
        for target, f in got.items():
            t = total.setdefault(target, {"calls": 0, "differing": None})
            t["calls"] += int(f.get("calls") or 0)
            if f.get("differing") is not None:
                t["differing"] = (t["differing"] or 0) + int(f["differing"])
    return findings(total) if seen else None


def inert_points(rows: Iterable[Mapping[str, Any]], reference: str | None) -> list[dict[str, Any]]:
    """Per arm and point where the arm is inert: {"arm", point fields, "findings"}; the reference
    arm never. Finished (ok) cells only, as the verdicts count them."""
    groups: dict[tuple[str, Point], list[Mapping[str, Any]]] = {}
    for r in rows:
        if r.get("status") == "ok" and r.get("arm") != reference:
            groups.setdefault((r["arm"], Point.of(r)), []).append(r)
    out = []
    for (arm, point), cells in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        f = point_findings(cells)
        if f:
            out.append({"arm": arm, **point.fields(), "findings": f})
    return out


def check_line(reference: bool, patches: Iterable[str], wraps: dict[str, list[str]], routing_off: bool) -> str:
    """For the dry run: can this arm be caught inert, and by which functions' counts."""
    if reference:
        return "the reference: never judged inert"
    patches = list(patches)
    if not patches:
        return "cannot be checked: no patch (whatever else differs is not a function the plugin counts)"
    if routing_off:
        return "cannot be checked: E2E_ROUTING_MODE=off (nothing is counted)"
    undeclared = [p for p in patches if p not in BUILTIN_TARGETS and not wraps.get(p)]
    if undeclared:
        return (
            f"cannot be checked: {', '.join(undeclared)} declares no targets "
            f"({WRAPS_ATTR} or @wraps: docs/concepts/arms.md)"
        )
    targets: list[str] = []
    for p in patches:
        targets += BUILTIN_TARGETS.get(p) or wraps.get(p) or []
    named = ", ".join(f"{t.split(':')[1]}{' (answers compared)' if t in GATES else ''}" for t in dict.fromkeys(targets))
    return f"checked: inert where {named} is never called (or never answers differently)"
