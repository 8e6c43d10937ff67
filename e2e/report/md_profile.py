"""report.md's kernel profile (summary.json's `profile`, e2e/profile/section.py): per point, where the
decode step goes per arm, and what differs between the arms, attributed to kernels. From the summary
alone; a run without profiles gets one line, and its verdicts are what they are without it."""

from __future__ import annotations

from typing import Any

from e2e.design.point import Point
from e2e.report.tables import markdown


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:+.3f}"


def _name(n: str) -> str:
    short = n if len(n) <= 70 else n[:67] + "..."
    return "`" + short.replace("|", "\\|").replace("`", "'") + "`"


def profile(s: dict[str, Any]) -> list[str]:
    p = s.get("profile")
    md = ["## Where the decode step goes (kernel profile)", ""]
    if p is None:
        return md + [
            "No kernel profile recorded in this run (its harness took none); the verdicts stand without it.",
            "",
        ]
    md += [
        "One untimed profiled round of the long and one of the short request per cell, after its server's "
        "timed and bookend rounds, through vLLM's own profiler; each kernel's calls and time differenced "
        "(long - short) / (tokens apart), as the timing is (docs/concepts/profile.md). Device kernels on a "
        "GPU, CPU ops' self time on the CPU lane. `ms` is per decode step (of the whole batch at c > 1), "
        "`share` of the step's profiled time.",
        "",
    ]
    for pt in p["points"]:
        md += [f"### {Point.of(pt)}", ""]
        missing = [f"- **{a['arm']}**: no profile ({a['reason']})" for a in pt["arms"] if a["status"] != "ok"]
        md += missing + ([""] if missing else [])
        md += _arms(pt)
        for d in pt["differences"]:
            md += _difference(d)
    return md


def _arms(pt: dict[str, Any]) -> list[str]:
    """The profiled arms at one point: the step by kernel group, side by side, then each arm's top kernels."""
    ok = [a for a in pt["arms"] if a["status"] == "ok"]
    if not ok:
        return []
    names = [g["group"] for g in ok[0]["groups"]]
    rows = [
        [g] + [f"{a['groups'][i]['ms']:.3f} ({_pct(a['groups'][i]['share'])})" for a in ok] for i, g in enumerate(names)
    ]
    rows.append(["**profiled step**"] + [f"**{a['step_ms']:.3f}**" for a in ok])
    md = [markdown(["group", *[f"{a['arm']} ms (share)" for a in ok]], rows), ""]
    for a in ok:
        md += [f"Top kernels, {a['arm']} ({a['source']}, {a['cells']} cell(s)):", ""]
        md += [
            markdown(
                ["kernel", "group", "calls / step", "ms / step", "share"],
                [
                    [_name(k["name"]), k["group"], f"{k['calls_per_step']:.2f}", f"{k['ms']:.4f}", _pct(k["share"])]
                    for k in a["top"]
                ],
            ),
            "",
        ]
    return md


def _difference(d: dict[str, Any]) -> list[str]:
    """What differs between an arm and the reference: the measured step difference, the kernels' share."""
    meas = d["measured_ms"]
    return [
        f"What differs, {d['arm']} - {d['reference']}: measured {_ms(meas)} ms per step (the timing), "
        f"kernels {_ms(d['kernels_ms'])} ms" + (f" ({100 * d['kernels_ms'] / meas:.0f} % of it)" if meas else "") + ":",
        "",
        markdown(
            ["kernel", "group", "ms / step"],
            [[_name(k["name"]), k["group"], _ms(k["ms"])] for k in d["top"]]
            + [["other kernels", "", _ms(d["other_kernels_ms"])]]
            + (
                [["not in the profile (host time, gaps, the profile's noise)", "", _ms(d["not_in_profile_ms"])]]
                if d["not_in_profile_ms"] is not None
                else []
            ),
        ),
        "",
    ]
