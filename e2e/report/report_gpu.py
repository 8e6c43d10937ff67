"""The report's section on GPU state and bookends (e2e/gpu/gpu_state.py, e2e/stats/bookends.py): per cell its
GPUs' clocks, power, temperature, throttled rounds and other processes; per server its bookend.
Markdown lines and warnings from the cell rows alone; report_md.py places them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from e2e.report import tables
from e2e.report.tables import num
from e2e.rundir.gpu_rows import cell_summary, describe
from e2e.stats.bookends import TEST, server_flags, servers_without

Throttled = dict[tuple[tuple[str, ...], tuple[int, ...]], list[str]]  # (reasons, rounds) -> the cells


def _span(v: list[float] | None, fmt: str = "{:.0f}") -> str:
    if not v:
        return tables.MISSING
    lo, hi = (fmt.format(x) for x in v)
    return lo if lo == hi else f"{lo}-{hi}"


def _unread(rows: list[dict[str, Any]]) -> list[str]:
    """Cells whose GPU went unchecked where it could be read: every reading failed, some did, or none
    could be taken while other cells' were (a driver that stopped answering). One line per cause,
    naming its cells and those that count all the same: no policy acts on a reading that failed."""
    any_read = any((r.get("gpu_state") or {}).get("samples") for r in rows)
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        g = r.get("gpu_state") or {}
        # rows from before failed_readings say it in their reason only
        failed = g.get("failed_readings") or (g.get("available") and g.get("reason"))
        if failed and g.get("samples"):
            what = "GPU partly checked"
        elif failed or (any_read and g and not g.get("available")):
            what = "GPU not checked"
        else:
            continue
        groups.setdefault((what, str(g.get("reason") or "no reason recorded")), []).append(r)
    out = []
    for (what, why), group in groups.items():
        cids = [r["cell_id"] for r in group]
        head = f"{cids[0]}: {what}" if len(cids) == 1 else f"{what} in {len(cids)} cells ({', '.join(cids)})"
        counted = [r["cell_id"] for r in group if r.get("status") == "ok"]
        policy = (group[0].get("gpu_state") or {}).get("policy")
        tail = (
            f"; COUNTED all the same ({', '.join(counted)}): --gpu-exclusive {policy} acts only on what a reading shows"
            if counted
            else ""
        )
        out.append(f"{head} ({why}): a process sharing the GPU meanwhile would not have been seen{tail}")
    return out


def warnings(cell_rows: Iterable[dict[str, Any]]) -> list[str]:
    """One line per thing a reader must not miss: a contaminated cell counted, a voided attempt, a
    GPU held before a start, throttled rounds, a blind process list, a GPU left unread, a
    non-stationary server."""
    rows = list(cell_rows)
    out = []
    throttled: Throttled = {}
    for r in rows:
        out += _cell_warnings(r, throttled)
    out += _unread(rows)
    states = [r.get("gpu_state") or {} for r in rows]
    blind = [g for g in states if g and not g.get("available") and g.get("policy") in ("retry", "fail")]
    if rows and len(blind) == len(rows):  # the policy acted on nothing: said among the warnings, not only above
        reasons = "; ".join(sorted({str(g.get("reason") or "no reason recorded") for g in blind}))
        out.append(
            f"GPU state read in none of the {len(rows)} cell(s) ({reasons}): --gpu-exclusive "
            f"{blind[0].get('policy')} acted on nothing; another process on the GPU would not have been seen"
        )
    out += _throttled(throttled, [r["cell_id"] for r in rows if (r.get("gpu_state") or {}).get("samples")])
    return out + _server_warnings(rows)


def _cell_warnings(r: dict[str, Any], throttled: Throttled) -> list[str]:
    """One cell's own lines; its throttled rounds are added to `throttled` (said once per pattern)."""
    g, s = r.get("gpu_state") or {}, cell_summary(r)
    cid = r["cell_id"]
    out = []
    if s["counted_contaminated"]:
        out.append(
            f"{cid}: measured beside another process on its GPU and COUNTED "
            f"(--gpu-exclusive {g.get('policy')}): {describe(g.get('foreign') or [])}"
        )
    for a in g.get("contaminated_attempts") or []:
        out.append(
            f"{cid}: attempt {a.get('attempt')} voided at '{a.get('at')}' (another process on the GPU: "
            f"{describe(a.get('foreign') or [])}); its rows are kept, never counted"
        )
    if g.get("pre_start_foreign"):
        out.append(f"{cid}: before its server started, the GPU held {describe(g['pre_start_foreign'])}")
    if s["throttled_rounds"]:
        throttled.setdefault((tuple(g.get("throttle_reasons") or []), tuple(s["throttled_rounds"])), []).append(cid)
    if g.get("available") and g.get("own_seen") is False:
        out.append(
            f"{cid}: NVML listed none of the server's own processes on its GPU: other processes "
            "may be invisible too (another pid namespace?)"
        )
    elif g.get("available") and g.get("samples") and g.get("own_seen") is None:
        out.append(f"{cid}: the GPU's processes could not be listed: another process would not have been seen")
    return out


def _throttled(throttled: Throttled, measured: list[str]) -> list[str]:
    """One line per pattern, naming its cells: an H200 at its power cap throttles every round of every
    cell alike, and eight identical lines would hide the one cell that differs."""
    out = []
    for (why, rounds), cids in throttled.items():
        where = f"{cids[0]}: GPU throttled" if len(cids) == 1 else "GPU throttled"
        tail = "" if len(cids) == 1 else f" of {len(cids)} cells: {', '.join(cids)}"
        alike = (
            " (every measured cell alike: the GPU's own limit under this load, not one arm's)"
            if len(cids) > 1 and cids == measured
            else ""
        )
        out.append(f"{where} ({', '.join(why)}) in timed round(s) {', '.join(map(str, rounds))}{tail}{alike}")
    return out


def _server_warnings(rows: list[dict[str, Any]]) -> list[str]:
    """Per server: a bookend that says it drifted, or no bookend to say whether it did."""
    out = []
    for key, b in server_flags(rows).items():
        if b["status"] == "non-stationary":
            out.append(
                f"server {key} (attempt {b.get('attempt')}): non-stationary: its first depth moved "
                f"{b['step_pct']:+.1f} % between its opening ({b.get('cell_id')}) and its close "
                f"(p {b['p_value']:.2g}); cells {', '.join(b['cells'])}"
            )
    for x in servers_without(rows):
        out.append(
            f"server {x['server_key']} (attempt {x['attempt']}): no bookend ({x['reason']}): its counted "
            f"cell(s) {', '.join(x['cells'])} untested for a drift"
        )
    return out


def section(cell_rows: Iterable[dict[str, Any]]) -> list[str]:
    """The section: per cell its GPUs' readings, per server its bookend, then the warnings."""
    rows = list(cell_rows)
    if not rows:
        return []
    md = ["## GPU state and bookends", ""]
    states = [r.get("gpu_state") or {} for r in rows]
    if not any(g.get("available") for g in states):
        why = sorted({g.get("reason") or "not recorded (a run before GPU state)" for g in states})
        md += [
            f"No GPU state could be read for any of the {len(rows)} cell(s): {'; '.join(why)}. "
            "Nothing here says whether another process shared a GPU.",
            "",
        ]
    else:
        md += [
            "Readings between rounds, never inside a timed request (power under load: the mean over "
            "each round from the energy counter). A process on a cell's GPU that is not its server "
            "makes the cell contaminated: `retry` measures it again on a fresh server (the voided "
            "attempt's rows stay, never counted), `warn` counts it and says so here, `fail` stops.",
            "",
            _state_table(rows, states),
            "",
        ]
    flags = server_flags(rows)
    if flags:
        # the values tested: the run's estimator once the analysis has tested them again (bookends.retest)
        ests = sorted({b.get("estimator") or "client" for b in flags.values() if "closing_rounds" in b})
        under = f", under the {' and the '.join(ests)} estimator" if ests else ""
        md += [
            f"Bookends: each server's first depth measured again at the end of its life; {TEST}{under}. "
            "A server is **non-stationary** at p < alpha with a step of at least the minimum "
            "(`python -m e2e.stats.bookends` gives the test's false-alarm rate by simulation). A server "
            "that ended before its bookend (voided, failed, or the run stopped) is listed with why.",
            "",
            _bookend_table(flags, servers_without(rows)),
            "",
        ]
    warn = warnings(rows)
    if warn:
        md += ["GPU and stationarity warnings:", ""] + [f"- {w}" for w in warn] + [""]
    return md


def _state_table(rows: list[dict[str, Any]], states: list[dict[str, Any]]) -> str:
    return tables.markdown(
        [
            "cell",
            "status",
            "GPU",
            "SM MHz",
            "mem MHz",
            "power W",
            "round power W",
            "temp C",
            "throttled rounds",
            "other processes",
            "policy",
        ],
        [
            [
                r["cell_id"],
                r.get("status", "-"),
                ", ".join(f"{x.get('index')} {x.get('name') or ''}".strip() for x in g.get("gpus") or [])
                or (g.get("reason") or "-"),
                _span(g.get("sm_mhz")),
                _span(g.get("mem_mhz")),
                _span(g.get("power_w")),
                _span(g.get("round_power_w")),
                _span(g.get("temp_c")),
                ", ".join(map(str, g.get("throttled_rounds") or [])) or "none",
                ("**" + describe(g["foreign"]) + "**") if g.get("foreign") else "none",
                str(g.get("policy") or "-"),
            ]
            for r, g in zip(rows, states)
        ],
    )


def _bookend_table(flags: dict[str, dict[str, Any]], without: list[dict[str, Any]]) -> str:
    """A row per server: its bookend, or none and why."""
    return tables.markdown(
        [
            "server",
            "cells",
            "first depth",
            "opening ms/tok",
            "closing ms/tok",
            "step %",
            "p",
            "rounds (open / close)",
            "bookend",
        ],
        [
            [
                key,
                ", ".join(b["cells"]),
                b.get("cell_id") or "-",
                num(b.get("opening_ms")),
                num(b.get("closing_ms")),
                num(b.get("step_pct"), "{:+.1f}"),
                num(b.get("p_value"), "{:.2g}"),
                f"{b.get('opening_rounds', 0)} / {b.get('closing_rounds', 0)}",
                f"**{b['status']}**"
                if b["status"] == "non-stationary"
                else (b["status"] + (f" ({b['reason']})" if b.get("reason") else "")),
            ]
            for key, b in flags.items()
        ]
        + [
            [
                f"{x['server_key']} (attempt {x['attempt']})",
                ", ".join(x["cells"]),
                *["-"] * 6,
                f"**none** ({x['reason']})",
            ]
            for x in without
        ],
    )
