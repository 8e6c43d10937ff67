"""history.png, drawn from history's rows (e2e/report/history.py): a panel per series, arm and point;
x: the runs in the chosen order, each labelled with its vLLM version and its place in time; change
points marked in their own panel with their verdict, and a panel without one titled with its
series' answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from e2e.design.point import Point
from e2e.report import tables
from e2e.report.figures import depth_label, error_bar
from e2e.stats import outcomes
from e2e.stats.verdicts import BETWEEN, EQUIVALENT, INCONCLUSIVE, INSUFFICIENT_REPLICATION

QUIET = {
    EQUIVALENT: " (no change point)",
    INCONCLUSIVE: " (cannot tell)",
    INSUFFICIENT_REPLICATION: " (too few servers)",
}


def draw(
    rows: list[dict[str, Any]],
    steps: list[dict[str, Any]],
    order_by: str,
    path: Path,
    answers: list[dict[str, Any]] | None = None,
) -> Path | None:
    """A panel per (series, arm, depth); None (no file) when no run has an estimate. answers: each
    series' answer (history.history), which titles a panel without a step (no change point, or
    cannot tell)."""
    said = {(a["series"], a["arm"], Point.of(a)): a["decision"] for a in answers or []}
    keys = sorted({(r["series"], r["arm"], Point.of(r)) for r in rows if r.get("estimate_ms") is not None})
    if not keys:
        return None
    runs = sorted({(r["order"], r["run"], r["vllm"], r["time_order"], r["started"], r["finished"]) for r in rows})
    arm_rows = list(dict.fromkeys((k[0], k[1]) for k in keys))
    points = sorted({k[2] for k in keys})
    fig, axes = tables.new_panels(
        max(4.2 * len(points), 0.9 * len(runs) * len(points)), 3.4 * len(arm_rows), len(arm_rows), len(points)
    )
    grid = {(sa, d): axes[i * len(points) + j] for i, sa in enumerate(arm_rows) for j, d in enumerate(points)}
    labels = [
        f"vLLM {v}\n#{t} in time\n{str(st or '')[5:16].replace('T', ' ')}" + ("" if done else "\nNOT FINISHED")
        for _, _, v, t, st, done in runs
    ]
    for ((series, arm), d), ax in grid.items():
        key = (series, arm, d)
        pts = sorted(
            (r for r in rows if (r["series"], r["arm"], Point.of(r)) == key and r.get("estimate_ms") is not None),
            key=lambda r: r["order"],
        )
        if not pts:
            ax.set_visible(False)
            continue
        _estimates(ax, pts)
        mine = [st for st in steps if (st["series"], st["arm"], Point.of(st)) == key]
        _change_points(ax, pts, mine)
        ax.set_xticks([o for o, *_ in runs], labels, fontsize=6)
        ax.set_xlim(-0.5, len(runs) - 0.5)
        answer = "" if mine else QUIET.get(said.get(key, ""), "")
        at_c = "" if d.concurrency == 1 else f", c = {d.concurrency}"  # a grid run's series is a point
        ax.set_title(f"series {series}: {arm} @ {depth_label(d.depth)}{at_c}{answer}", fontsize=9)
        ax.set_ylabel("decode ms/token")
        ax.grid(alpha=0.3)
    fig.suptitle(
        f"History, runs ordered by {order_by} (each run's place in time below its version); "
        "filled: 95 % CI between servers",
        fontsize=9,
    )
    return tables.save_figure(fig, path)


def _estimates(ax: Any, pts: list[dict[str, Any]]) -> None:
    """One run's estimate per point, filled where its interval is between servers."""
    for r in pts:
        lo, hi = r.get("ci_lo_ms"), r.get("ci_hi_ms")
        ax.errorbar(
            [r["order"]],
            [r["estimate_ms"]],
            yerr=error_bar(r["estimate_ms"], lo, hi),
            fmt="o",
            color="C0",
            capsize=3,
            ms=4,
            mfc="C0" if r.get("ci_kind") == BETWEEN else "white",
        )


def _change_points(ax: Any, pts: list[dict[str, Any]], steps: list[dict[str, Any]]) -> None:
    """The panel's change points: a dashed line before the first run after each, with its verdict."""
    for st in steps:
        w = outcomes.latency(st["decision"])
        x = next(r["order"] for r in pts if r["run"] == st["first_run"]) - 0.5
        ax.axvline(x, color=w.colour if w else "black", ls="--", lw=1)
        ax.annotate(
            f"{st['decision']} step\nratio {st['ratio']:.3f}" if st.get("ratio") else st["decision"],
            (x, 0),
            xycoords=("data", "axes fraction"),
            xytext=(-3, 4),
            textcoords="offset points",
            ha="right",
            va="bottom",
            fontsize=7,
            color=w.colour if w else "black",
        )
