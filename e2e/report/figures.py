"""A run's figures, drawn from its summary (e2e/report/summary.py), each showing what the text claims:
a comparison on its own scale with the equivalence margin visible, the kind of interval named
("between servers" only where there were servers to pool, "within-server" otherwise), lines only
between cells that one server served, and no figure where there is nothing to draw.

    ratio_vs_depth.png   a panel per arm / reference pair: the ratio per depth with its 95 % interval,
                         coloured and labelled by its verdict (e2e/stats/outcomes.py), the per-pass ratios,
                         the +-min-effect margin; log scale when a panel spans more than 3x. A run at
                         several concurrencies (the grid): a line per c in each panel, filled where
                         decided, so how the ratio moves with batch and depth shows at a glance
    decode_vs_depth.png  every cell's decode ms/token with its own (within-server) 95 % interval (a
                         panel per concurrency in a grid run)

history.png is history's (e2e/report/history_figure.py), on the same depth labels and error bars.
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import Any

from e2e.design.point import Point
from e2e.report import tables
from e2e.stats import outcomes
from e2e.stats.verdicts import BETWEEN

RATIO, DECODE = "ratio_vs_depth.png", "decode_vs_depth.png"
FILES = (DECODE, RATIO)
SPAN_FOR_LOG = 3.0  # a panel whose values span more than this factor gets a log axis


def _c(row: dict[str, Any]) -> int:
    return Point.of(row).concurrency


def _grid(s: dict[str, Any]) -> bool:
    """A run at several concurrencies: its ratio figure and caption are the grid's."""
    return len({_c(c) for c in _pooled(s)}) > 1


def _pooled(s: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in s["comparisons"] if c["scope"] == "pooled" and c.get("ratio") is not None]


def _measured(s: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in s["cells"] if c.get("estimate_ms") is not None]


def drawn(s: dict[str, Any]) -> list[str]:
    """The figures a summary has data for (report.md links only these)."""
    return ([DECODE] if _measured(s) else []) + ([RATIO] if _pooled(s) else [])


def depth_label(d: int) -> str:
    return f"{d // 1024}K" if d >= 1024 and d % 1024 == 0 else str(d)


def ratio_caption(s: dict[str, Any]) -> str:
    if _grid(s):
        return grid_caption(s)
    kinds = {c.get("ci_kind") for c in _pooled(s)}
    what = (
        "95 % intervals between servers (the variance model)"
        if kinds == {BETWEEN}
        else "within-server intervals only (one server in an arm: no verdict)"
        if BETWEEN not in kinds
        else "95 % intervals between servers where an arm had two or more, within-server otherwise"
    )
    return (
        f"A panel per arm pair, each on its own scale: the ratio per depth with {what}, coloured by its "
        f"verdict; grey x: per pass; shaded: the ±{s['run']['min_effect_pct']:g} % equivalence margin."
    )


def grid_caption(s: dict[str, Any]) -> str:
    cs = sorted({_c(c) for c in _pooled(s)})
    mixed = (
        " Points measured under different server flags have their own marker shape (the legend names the "
        "flags that differ), and a line joining two of them is dotted: the runs are not one setting."
        if len(settings(_pooled(s))) > 1
        else ""
    )
    return (
        "A panel per arm pair, each on its own scale: the ratio per depth with its 95 % interval, one line "
        f"per concurrency c (c = {', '.join(map(str, cs))} requests decoding together), a filled marker where "
        "the point was decided (slower, faster, equivalent), hollow where not (its verdict is in the tables); "
        f"shaded: the ±{s['run']['min_effect_pct']:g} % equivalence margin.{mixed}"
    )


def decode_caption(s: dict[str, Any]) -> str:
    cells = _measured(s)
    joined = _server_lines(cells)
    # a cell with too few usable rounds has no interval and no bar: named, so no point reads as covered
    bare = [c["cell_id"] for c in cells if c.get("ci_lo_ms") is None or c.get("ci_hi_ms") is None]
    bars = (
        "with its own within-server 95 % interval"
        if not bare
        else "with no interval: no cell had one (the warnings say why)"
        if len(bare) == len(cells)
        else f"with its own within-server 95 % interval, except {len(bare)} cell(s) with none, drawn without a bar "
        f"(the warnings say why): {', '.join(bare)}"
    )
    return f"Each point is one cell (one server at one depth) {bars}; " + (
        "lines join the depths one server served." if joined else "no lines: every cell had its own server."
    )


def _server_lines(cells: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    by: dict[str, list[dict[str, Any]]] = {}
    for c in cells:
        if c.get("server"):
            by.setdefault(c["server"], []).append(c)
    return {k: sorted(v, key=lambda c: c["depth"]) for k, v in by.items() if len(v) > 1}


def depth_axis(ax: Any, depths: list[int], label: str = "context depth (tokens)") -> None:
    """A log2 depth axis ticked at the depths measured (1K, 8K, ...), nothing else."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(depths, [depth_label(d) for d in depths])
    ax.minorticks_off()
    lo, hi = min(depths), max(depths)
    ax.set_xlim(lo / 1.6, hi * 1.6)
    ax.set_xlabel(label)


def _y_range(ax: Any, values: list[float], label: str, headroom: float = 0.0) -> None:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:  # nothing to scale to: matplotlib's default range, never an exception after a run
        ax.set_ylabel(label)
        return
    lo, hi = min(vals), max(vals)
    # A log axis only for positive values: a noisy tiny decode can estimate at or below zero (a
    # stand-in at 1 ms/token under load did), and the harness must still write its report.
    if lo > 0 and hi / lo > SPAN_FOR_LOG:
        from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

        ax.set_yscale("log")
        ax.set_ylim(lo / 1.15, hi * 1.15 * (1 + 3 * headroom))
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        label += " (log scale)"
    else:
        pad = (hi - lo) * 0.12 or abs(hi) * 0.01
        ax.set_ylim(lo - pad, hi + pad + (hi - lo) * headroom)
    ax.set_ylabel(label)


def error_bar(value: float, lo: float | None, hi: float | None) -> list[list[float]] | None:
    """matplotlib's asymmetric error bar for an interval (None: no interval, no bar)."""
    return [[value - lo], [hi - value]] if lo is not None and hi is not None else None


def draw_run(s: dict[str, Any], root: Path) -> list[Path]:
    out = []
    if DECODE in drawn(s):
        out.append(_decode(s, root / DECODE))
    if RATIO in drawn(s):
        out.append((ratio_grid if _grid(s) else _ratio)(s, root / RATIO))
    return out


MARKERS = ("o", "s", "^", "D", "v", "P")


def settings(rows: list[dict[str, Any]]) -> dict[Any, tuple[str, str]]:
    """Per distinct server flags among the rows (`grid` adds each run's; a run's own rows have none):
    its marker and a legend label naming what sets it apart from the others."""
    groups = list(dict.fromkeys(r.get("server_flags") for r in rows))
    split = {g: shlex.split(g) if isinstance(g, str) and g != "-" else [] for g in groups}
    shared = set.intersection(*(set(v) for v in split.values())) if groups else set()
    out = {}
    for i, g in enumerate(groups):
        extra = [t for t in split[g] if t not in shared]
        runs = ", ".join(dict.fromkeys(str(r.get("run")) for r in rows if r.get("server_flags") == g))
        out[g] = (MARKERS[i % len(MARKERS)], f"{runs}: " + (shlex.join(extra) if extra else "shared server flags only"))
    return out


def _margin_band(ax: Any, margin: float) -> list[float]:
    """The shaded equivalence margin and the line at 1; its edges, which the y range must hold."""
    ax.axhspan(1 / margin, margin, color="0.85", zorder=0)
    ax.axhline(1.0, color="black", lw=0.7, zorder=1)
    return [1 / margin, margin]


def ratio_grid(s: dict[str, Any], path: Path) -> Path:
    """The grid: a panel per arm pair, a line per concurrency over the depths (a run's, or `grid`'s
    across runs: e2e/report/grid.py)."""
    f = s["run"]
    pooled = _pooled(s)
    pairs = list(dict.fromkeys(c["arm"] for c in pooled))
    cs = sorted({_c(c) for c in pooled})
    ncol = min(3, len(pairs))
    nrow = math.ceil(len(pairs) / ncol)
    fig, axes = tables.new_panels(max(7.5, 4.8 * ncol), 3.8 * nrow + 1.1, nrow, ncol)
    margin = 1 + f["min_effect_pct"] / 100
    shift = {c: 2 ** (0.25 * ((i + 0.5) / len(cs) - 0.5)) for i, c in enumerate(cs)}  # x is log2
    flags = settings(pooled)
    for ax, arm in zip(axes, pairs):
        ys = _margin_band(ax, margin)
        for i, c in enumerate(cs):
            rows = sorted((r for r in pooled if r["arm"] == arm and _c(r) == c), key=lambda r: r["depth"])
            if not rows:
                continue  # this arm has no ratio at this c (a grid across runs: another run's arm)
            ys += _concurrency_line(ax, rows, c, f"C{i}", shift[c], flags)
        if len(flags) > 1:  # the flag sets this panel holds, each its marker
            for g in dict.fromkeys(r.get("server_flags") for r in pooled if r["arm"] == arm):
                ax.plot([], [], flags[g][0], color="0.3", mfc="white", ls="none", label=flags[g][1])
        depth_axis(ax, sorted({r["depth"] for r in pooled if r["arm"] == arm}))
        _y_range(ax, ys, "decode ratio arm / reference", headroom=0.08)
        ax.set_title(f"{arm} / {f['reference_arm']}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, title="requests decoding together", title_fontsize=7)
    for ax in axes[len(pairs) :]:
        ax.set_visible(False)
    fig.suptitle(
        "Arm / reference decode time per step, by depth and concurrency c\n"
        f"(> 1: the arm is slower; shaded: the ±{f['min_effect_pct']:g} % margin; filled: decided)",
        fontsize=9.5,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return tables.save_figure(fig, path, layout=False)


def _concurrency_line(
    ax: Any, rows: list[dict[str, Any]], c: int, colour: str, shift: float, flags: dict[Any, tuple[str, str]]
) -> list[float]:
    """One concurrency's ratios over the depths in a grid panel (x shifted apart from the other c's);
    the values drawn, for the y range."""
    xs = [r["depth"] * shift for r in rows]
    ax.plot([], [], color=colour, lw=1.2, label=f"c = {c}")
    for j in range(1, len(rows)):
        # a line never joins points measured under different server flags unmarked: dotted there
        same = rows[j].get("server_flags") == rows[j - 1].get("server_flags")
        ax.plot(
            xs[j - 1 : j + 1],
            [rows[j - 1]["ratio"], rows[j]["ratio"]],
            color=colour,
            lw=1.2 if same else 1.0,
            ls="-" if same else ":",
            zorder=2,
        )
    ys: list[float] = []
    for x, r in zip(xs, rows):
        w = outcomes.latency(r["decision"])
        lo, hi = r.get("ratio_ci_lo"), r.get("ratio_ci_hi")
        ax.errorbar(
            [x],
            [r["ratio"]],
            yerr=error_bar(r["ratio"], lo, hi),
            fmt=flags[r.get("server_flags")][0],
            color=colour,
            mfc=colour if w and w.decided else "white",
            capsize=3,
            ms=5,
            zorder=3,
        )
        ys += [r["ratio"]] + [v for v in (lo, hi) if v is not None]
    return ys


def _ratio(s: dict[str, Any], path: Path) -> Path:
    f = s["run"]
    pooled = _pooled(s)
    pairs = list(dict.fromkeys(c["arm"] for c in pooled))
    ncol = min(3, len(pairs))
    nrow = math.ceil(len(pairs) / ncol)
    fig, axes = tables.new_panels(max(7.5, 4.6 * ncol), 3.6 * nrow + 1.1, nrow, ncol)
    margin = 1 + f["min_effect_pct"] / 100
    # per pass only when there are passes to tell apart (with one, it is the pooled point again)
    per_pass = [
        c for c in s["comparisons"] if c["scope"] == "pass" and c.get("ratio") is not None and len(f["passes"]) > 1
    ]
    for ax, arm in zip(axes, pairs):
        rows = sorted((c for c in pooled if c["arm"] == arm), key=lambda c: c["depth"])
        ys = _margin_band(ax, margin)
        for c in rows:
            ys += _verdict_point(ax, c)
        pp = [c for c in per_pass if c["arm"] == arm]
        if pp:
            ax.scatter(
                [c["depth"] * 1.08 for c in pp], [c["ratio"] for c in pp], marker="x", color="0.45", s=18, zorder=2
            )
            ys += [c["ratio"] for c in pp]
        depth_axis(ax, sorted({c["depth"] for c in rows}))
        _y_range(ax, ys, "decode ratio arm / reference", headroom=0.12)
        ax.set_title(
            f"{arm} / {f['reference_arm']}: {rows[0]['n_arm']} + {rows[0]['n_ref']} servers, {_intervals(rows)}",
            fontsize=8.5,
        )
        ax.grid(alpha=0.3)
    for ax in axes[len(pairs) :]:
        ax.set_visible(False)
    _ratio_legend(fig, f["min_effect_pct"], margin, bool(per_pass), ncol)
    fig.suptitle("Arm / reference decode ms/token per depth (> 1: the arm is slower), coloured by verdict", fontsize=10)
    fig.tight_layout(rect=(0, 0.07 if ncol > 1 else 0.11, 1, 1))
    return tables.save_figure(fig, path, layout=False)


def _verdict_point(ax: Any, c: dict[str, Any]) -> list[float]:
    """One pooled comparison: its ratio and interval, coloured and labelled by its verdict (filled
    where decided); the values drawn, for the y range."""
    w = outcomes.latency(c["decision"])
    colour = w.colour if w else "black"
    lo, hi = c.get("ratio_ci_lo"), c.get("ratio_ci_hi")
    ax.errorbar(
        [c["depth"]],
        [c["ratio"]],
        yerr=error_bar(c["ratio"], lo, hi),
        fmt="o",
        mfc=colour if w and w.decided else "white",
        color=colour,
        capsize=4,
        ms=6,
        zorder=3,
    )
    ax.annotate(
        c["decision"],
        (c["depth"], hi if hi is not None else c["ratio"]),
        textcoords="offset points",
        xytext=(0, 5),
        ha="center",
        fontsize=7,
        color=colour,
    )
    return [c["ratio"]] + [v for v in (lo, hi) if v is not None]


def _intervals(rows: list[dict[str, Any]]) -> str:
    """What a panel's intervals are, for its title: only between-server ones carry a verdict."""
    kinds = {c.get("ci_kind") for c in rows}
    return (
        "95 % CI between servers"
        if kinds == {BETWEEN}
        else "within-server interval: no verdict"
        if BETWEEN not in kinds
        else "intervals of both kinds"
    )


def _ratio_legend(fig: Any, min_effect_pct: float, margin: float, per_pass: bool, ncol: int) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [
        Patch(color="0.85", label=f"±{min_effect_pct:g} % equivalence margin ({1 / margin:.3f} to {margin:.3f})"),
        Line2D([], [], marker="o", color="black", ls="", label="filled: decided (slower, faster, equivalent)"),
        Line2D([], [], marker="o", color="black", mfc="white", ls="", label="hollow: not decided"),
    ]
    if per_pass:
        handles.append(Line2D([], [], marker="x", color="0.45", ls="", label="per pass (two servers, no verdict)"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles) if ncol > 1 else 2, fontsize=7, frameon=False)


def _decode(s: dict[str, Any], path: Path) -> Path:
    f = s["run"]
    cells = _measured(s)
    arms = [a for a in f["arms"] if any(c["arm"] == a for c in cells)]
    cs = sorted({_c(c) for c in cells})
    if len(cs) == 1:
        fig, (ax,) = tables.new_panels(7.2, 4.6)
        _decode_panel(ax, f, cells, arms, "Decode ms/token per cell")
        return tables.save_figure(fig, path)
    fig, axes = tables.new_panels(
        5.2 * min(3, len(cs)), 4.4 * math.ceil(len(cs) / 3), math.ceil(len(cs) / 3), min(3, len(cs))
    )
    for ax, c in zip(axes, cs):
        _decode_panel(ax, f, [x for x in cells if _c(x) == c], arms, f"c = {c}: ms per decode step")
    for ax in axes[len(cs) :]:
        ax.set_visible(False)
    return tables.save_figure(fig, path)


def _decode_panel(ax: Any, f: dict[str, Any], cells: list[dict[str, Any]], arms: list[str], what: str) -> None:
    passes = sorted({c["pass"] for c in cells})
    colours = {a: f"C{i}" for i, a in enumerate(arms)}
    # spread the cells of one depth apart: arm by arm, pass by pass (x is log2: a factor is a shift)
    slots = [(a, p) for a in arms for p in passes]
    shift = {k: 2 ** (0.35 * ((i + 0.5) / len(slots) - 0.5)) for i, k in enumerate(slots)}
    ys: list[float] = []
    for a in arms:
        mine = [c for c in cells if c["arm"] == a]
        for c in mine:
            lo, hi = c.get("ci_lo_ms"), c.get("ci_hi_ms")
            ax.errorbar(
                [c["depth"] * shift[(a, c["pass"])]],
                [c["estimate_ms"]],
                yerr=error_bar(c["estimate_ms"], lo, hi),
                fmt="o",
                color=colours[a],
                capsize=3,
                ms=4,
            )
            ys += [c["estimate_ms"]] + [v for v in (lo, hi) if v is not None]
        ax.plot([], [], "o", color=colours[a], label=f"{a} ({len(mine)} cells)")
    for line in _server_lines(cells).values():
        ax.plot(
            [c["depth"] * shift[(c["arm"], c["pass"])] for c in line],
            [c["estimate_ms"] for c in line],
            color=colours[line[0]["arm"]],
            lw=0.8,
            alpha=0.7,
        )
    depth_axis(ax, sorted({c["depth"] for c in cells}))
    _y_range(ax, ys, "decode ms per token")
    y = "Y" if f.get("estimator") == "prefill-corrected" else "T"  # the estimator that decided
    ax.set_title(
        f"{what}, ({y}{f['long_tokens']} - {y}{f['short_tokens']}) / "
        f"{f['long_tokens'] - f['short_tokens']} ({f.get('estimator') or 'client'}): bars within-server 95 %",
        fontsize=9,
    )
    ax.grid(alpha=0.3)
    ax.legend(
        fontsize=7,
        title=("lines: one server's depths" if _server_lines(cells) else "one server per cell"),
        title_fontsize=7,
    )
