"""The figures the docs quote, by id: each a run folder under results/, a value of that folder
(e2e/report/doc_figure_values.py) and the format that prints it. A page marks a quote with its id
(e2e/report/doc_figures.py checks and rewrites the marks); a verdict table's ratio or MDE needs no
entry here: `figure` reads `ratio/RUN/ARM/DEPTH[/cC]` and `mde/RUN/ARM/DEPTH[/cC]` itself.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from e2e.report.doc_figure_values import (
    RATIO_KEYS,
    Figure,
    RunFolder,
    arm_geomean,
    bandwidth,
    cell_mean,
    cell_span,
    cell_span_over_runs,
    cells_by_pass,
    client_over_server,
    comparison_keys,
    floors,
    grid_mdes,
    half_widths,
    mde,
    mixed_ratio,
    ratio,
    ratio_span_over_runs,
    raw_cell_mean,
    round_span,
    stalled_ms,
    stalled_steps,
    starts,
    step,
)
from e2e.stats import estimate

L1, L8, L32 = "h200-load-tp1", "h200-load-8k-tp1", "h200-load-32k-tp1"
K1, K8, K32 = 1024, 8192, 32768
RC = "{:.3f} ({:.3f} to {:.3f})"
FA3 = ("stock", "widened")  # both arms run FlashAttention 3 on NVIDIA (the widened gate is False)
FIGURES: dict[str, Figure] = {
    # results/h200-load-grid: a run's own MDE -> the joint Holm family's (grid.json)
    "grid.mde.8k.c4": Figure("h200-load-grid", grid_mdes("rocm-attn", K8, 4), "{:.1f} -> {:.1f} %"),
    "grid.mde.32k.c4": Figure("h200-load-grid", grid_mdes("rocm-attn", K32, 4), "{:.1f} -> {:.1f} %"),
    "grid.mde.1k.c1": Figure("h200-load-grid", grid_mdes("rocm-attn", K1, 1), "{:.1f} -> {:.1f} %"),
    # results/h200-load-tp1: ROCM_ATTN / FA3 at 1K and 8K, 64 vs 8 tokens
    "load.rocm.1k.c1": Figure(L1, ratio("rocm-attn", K1, 1), RC),
    "load.rocm.1k.c4": Figure(L1, ratio("rocm-attn", K1, 4), RC),
    "load.rocm.1k.c16": Figure(L1, ratio("rocm-attn", K1, 16), RC),
    "load.rocm.1k.c32": Figure(L1, ratio("rocm-attn", K1, 32), RC),
    "load.rocm.8k.c1": Figure(L1, ratio("rocm-attn", K8, 1), RC),
    "load.rocm.8k.c4": Figure(L1, ratio("rocm-attn", K8, 4), RC),
    "load.rocm.1k.c1.x": Figure(L1, ratio("rocm-attn", K1, 1), "{:.2f}x"),
    "load.rocm.1k.c32.x": Figure(L1, ratio("rocm-attn", K1, 32), "{:.2f}x"),
    "load.rocm.8k.c1.x": Figure(L1, ratio("rocm-attn", K8, 1), "{:.2f}x"),
    "load.fa3.1k.c1": Figure(L1, step("stock", K1, 1), "{:.2f}"),
    "load.fa3.8k.c1": Figure(L1, step("stock", K8, 1), "{:.2f}"),
    "load.fa3.8k.c4": Figure(L1, step("stock", K8, 4), "{:.2f}"),
    "load.rocm.1k.c1.ms": Figure(L1, step("rocm-attn", K1, 1), "{:.1f}"),
    "load.rocm.8k.c1.ms": Figure(L1, step("rocm-attn", K8, 1), "{:.2f}"),
    "load.rocm.8k.c4.ms": Figure(L1, step("rocm-attn", K8, 4), "{:.1f}"),
    "load.fa3.8k.stalled.client": Figure(
        L1, raw_cell_mean("stock", [(K8, 16), (K8, 32)], "decode_ms_per_token", passes=(1,)), "{:.1f}"
    ),
    "load.fa3.8k.c16.server": Figure(L1, raw_cell_mean("stock", [(K8, 16)], "server_decode_ms_per_token"), "{:.1f}"),
    "load.fa3.8k.c32.server": Figure(L1, raw_cell_mean("stock", [(K8, 32)], "server_decode_ms_per_token"), "{:.1f}"),
    "load.stalled.ms": Figure(L1, stalled_ms, "{:.0f} to {:.0f} ms"),
    "load.stalled.steps": Figure(L1, stalled_steps, "{:.2f} to {:.2f}"),
    "load.rocm.1k.c16.client": Figure(L1, client_over_server("rocm-attn", K1, 16), "{:+.1f} %"),
    "load.rocm.1k.c16.client.p1": Figure(
        L1, client_over_server("rocm-attn", K1, 16, "p1-d1024-c16-rocm-attn"), "{:+.1f} %"
    ),
    "load.tput.1k.c32": Figure(
        L1,
        lambda r: [r.load("rocm-attn", K1, 32)["tokens_per_s"], r.load("stock", K1, 32)["tokens_per_s"]],
        "{1:.0f} tokens/s against {0:.0f}",
    ),
    # results/h200-load-8k-tp1: 8K again, 128 vs 32 tokens
    "load8k.rocm.c4": Figure(L8, ratio("rocm-attn", K8, 4), RC),
    "load8k.rocm.c16": Figure(L8, ratio("rocm-attn", K8, 16), RC),
    "load8k.rocm.c32": Figure(L8, ratio("rocm-attn", K8, 32), RC),
    "load8k.rocm.c4.x": Figure(L8, ratio("rocm-attn", K8, 4), "{:.2f}"),
    "load8k.rocm.c16.x": Figure(L8, ratio("rocm-attn", K8, 16), "{:.2f}"),
    "load8k.rocm.c32.x": Figure(L8, ratio("rocm-attn", K8, 32), "{:.2f}"),
    "load8k.fa3.steps": Figure(
        L8, lambda r: [r.load("stock", K8, c)["step_ms"] for c in (4, 16, 32)], "{:.2f} / {:.2f} / {:.2f}"
    ),
    "load8k.fa3.server": Figure(
        L8,
        lambda r: [cell_mean("stock", K8, c, "server_estimate_ms")(r)[0] for c in (4, 16, 32)],
        "{:.1f} / {:.1f} / {:.1f}",
    ),
    "load8k.fa3.c16": Figure(L8, step("stock", K8, 16), "{:.2f}"),
    "load8k.fa3.c16.server": Figure(L8, cell_mean("stock", K8, 16, "server_estimate_ms"), "{:.2f}"),
    "load8k.fa3.c4": Figure(L8, step("stock", K8, 4), "{:.2f}"),
    "load8k.rocm.c4.ms": Figure(L8, step("rocm-attn", K8, 4), "{:.1f}"),
    "load8k.mde": Figure(
        L8,
        lambda r: [
            min(mde("rocm-attn", K8, c)(r)[0] for c in (4, 16, 32)),
            max(mde("rocm-attn", K8, c)(r)[0] for c in (4, 16, 32)),
        ],
        "{:.1f}-{:.1f} %",
    ),
    # results/h200-load-32k-tp1: 32K, 64 vs 32 tokens, --disable-hybrid-kv-cache-manager
    "load32k.rocm.c1": Figure(L32, ratio("rocm-attn", K32, 1), RC),
    "load32k.rocm.c4": Figure(L32, ratio("rocm-attn", K32, 4), RC),
    "load32k.rocm.c1.x": Figure(L32, ratio("rocm-attn", K32, 1), "{:.2f}x"),
    "load32k.rocm.c4.x": Figure(L32, ratio("rocm-attn", K32, 4), "{:.2f}x"),
    "load32k.widened.c1": Figure(L32, ratio("widened", K32, 1), RC),
    "load32k.widened.c4": Figure(L32, ratio("widened", K32, 4), RC),
    "load32k.widened.c1.r": Figure(L32, ratio("widened", K32, 1), "{:.3f}"),
    "load32k.widened.c4.r": Figure(L32, ratio("widened", K32, 4), "{:.3f}"),
    "load32k.widened.mde": Figure(
        L32, lambda r: [mde("widened", K32, 1)(r)[0], mde("widened", K32, 4)(r)[0]], "MDE {:.1f} % and {:.1f} %"
    ),
    "load32k.fa3.c1": Figure(L32, step("stock", K32, 1), "{:.2f}"),
    "load32k.fa3.c4": Figure(L32, step("stock", K32, 4), "{:.2f}"),
    "load32k.rocm.c1.ms": Figure(L32, step("rocm-attn", K32, 1), "{:.1f}"),
    "load32k.rocm.c4.ms": Figure(L32, step("rocm-attn", K32, 4), "{:.1f}"),
    "load32k.fa3.c4.hw": Figure(L32, cell_span(FA3, K32, 4, "half_width_pct"), "+-{:.1f} to {:.1f} %"),
    "load32k.fa3.c4.ttft": Figure(L32, round_span(FA3, K32, 4, "server_ttft_s"), "{:.0f} to {:.0f} ms"),
    "load32k.fa3.c1.ttft": Figure(L32, round_span(FA3, K32, 1, "server_ttft_s"), "{:.0f}-{:.0f}"),
    "load32k.fa3.c4.prefill": Figure(L32, round_span(FA3, K32, 4, "server_prefill_s"), "{:.0f}-{:.0f} ms"),
    "load32k.rocm.c4.ttft": Figure(L32, round_span("rocm-attn", K32, 4, "server_ttft_s"), "{:.0f} to {:.0f} ms"),
    "load32k.rocm.c1.ttft": Figure(L32, round_span("rocm-attn", K32, 1, "server_ttft_s"), "{:.0f}-{:.0f}"),
    "load32k.stock.server": Figure(
        L32,
        lambda r: [
            *cell_span("stock", K32, 1, "server_estimate_ms")(r),
            *cell_span("stock", K32, 4, "server_estimate_ms")(r),
        ],
        "{:.2f}-{:.2f} and {:.2f}-{:.2f}",
    ),
    "load32k.fa3.c1.server": Figure(L32, cell_span(FA3, K32, 1, "server_estimate_ms"), "{:.2f}-{:.2f} ms"),
    "load32k.rocm.c1.ms2": Figure(L32, step("rocm-attn", K32, 1), "{:.2f}"),
    "load32k.rocm.c4.ms2": Figure(L32, step("rocm-attn", K32, 4), "{:.2f}"),
    "load32k.rocm.mde": Figure(
        L32, lambda r: [mde("rocm-attn", K32, 1)(r)[0], mde("rocm-attn", K32, 4)(r)[0]], "MDE {:.1f} %, {:.1f} %"
    ),
}


FIGURES["ref.rocm-attn.8k.client"] = Figure(
    "h200-reference-tp1", cells_by_pass("rocm-attn", K8, "client_estimate_ms"), "{:.2f}, {:.2f}"
)
FIGURES["ref.rocm-attn.32k.mean"] = Figure(
    "h200-reference-tp1", cell_mean("rocm-attn", K32, 1, "client_estimate_ms"), "{:.0f}"
)
for _arm in ("stock", "rocm-attn"):
    for _d, _k in ((K1, "1k"), (K8, "8k")):
        FIGURES[f"ref.{_arm}.{_k}.mean"] = Figure(
            "h200-reference-tp1", arm_geomean(_arm, _d), "{:.2f}" if _arm == "stock" else "{:.1f}"
        )
# The batch-1 H200 runs' per-cell tables (docs/results/index.md): each arm's cells in pass order,
# on the estimate each table states (the reference and TRITON_ATTN tables: the plain client estimate,
# as first reported; precision: today's).
for _tag, _run, _names, _key in (
    ("ref", "h200-reference-tp1", ("stock", "widened", "rocm-attn"), "client_estimate_ms"),
    ("prec", "h200-precision-tp1", ("stock", "widened"), "estimate_ms"),
    ("triton", "h200-triton-tp1", ("stock", "triton-attn"), "client_estimate_ms"),
):
    _n = 3 if _tag == "prec" else 2
    for _arm in _names:
        for _d, _k in ((K1, "1k"), (K8, "8k"), (K32, "32k")):
            FIGURES[f"{_tag}.{_arm}.{_k}.cells"] = Figure(
                _run, cells_by_pass(_arm, _d, _key), ", ".join(["{:.2f}"] * _n)
            )
for _d, _k in ((K1, "1k"), (K8, "8k"), (K32, "32k")):
    FIGURES[f"prec.widened.{_k}"] = Figure(
        "h200-precision-tp1",
        comparison_keys("widened", _d, RATIO_KEYS + ("ci_half_width_pct",)),
        "{:.3f} ({:.3f}-{:.3f}), +-{:.2f} %",
    )
    FIGURES[f"prec.widened.{_k}.df"] = Figure("h200-precision-tp1", comparison_keys("widened", _d, ("df",)), "{:.1f}")
    FIGURES[f"prec.widened.{_k}.mde"] = Figure("h200-precision-tp1", mde("widened", _d), "{:.1f} %")
# docs/concepts/estimator.md: why the prefill-corrected estimate (h200-reference-tp1, FA3's cells)
for _est, _e in ((estimate.CLIENT, "plain"), (estimate.CORRECTED, "corrected")):
    for _d, _k in ((K1, "1k"), (K8, "8k"), (K32, "32k")):
        FIGURES[f"est.hw.{_e}.{_k}"] = Figure(
            "h200-reference-tp1",
            half_widths(FA3, _d, _est),
            "{:.1f}-{:.1f}" if (_e, _k) == ("plain", "32k") else "{:.2f}-{:.2f}",
        )
FIGURES["est.mixed.32k"] = Figure(
    "h200-reference-tp1", mixed_ratio("widened", estimate.CLIENT, "stock", estimate.CORRECTED, K32), "{:.3f}"
)
FIGURES["est.same.32k"] = Figure("h200-reference-tp1", ratio("widened", K32), "{:.3f}")


def _pooled_of(arm: str) -> Callable[[RunFolder], list[dict[str, Any]]]:
    return lambda r: [r.comparison(arm, d) for d in (K1, K8, K32)]


def _rereported(r: RunFolder) -> Sequence[Any]:
    cs = _pooled_of("widened")(r)
    words = [c["decision"] for c in cs]
    head = (
        f"**{words[0]}** at every depth"
        if len(set(words)) == 1
        else " / ".join(f"**{w}**" for w in words) + " at 1K / 8K / 32K"
    )
    return [head, *(c["ci_half_width_pct"] for c in cs)]


FIGURES["ref.widened.rereported"] = Figure("h200-reference-tp1", _rereported, "{}, +-{:.2f} / {:.2f} / {:.2f} %")
FIGURES["triton.rereported"] = Figure(
    "h200-triton-tp1",
    lambda r: [c["ci_half_width_pct"] for c in _pooled_of("triton-attn")(r)],
    "+-{:.2f} / {:.2f} / {:.2f} %",
)
FIGURES["prec.pilot.widest"] = Figure(
    "h200-precision-tp1", lambda r: [r.summary["run"]["replication"]["pilot_widest_ci_half_width_pct"]], "+-{:.2f} %"
)
FIGURES["prec.predicted"] = Figure(
    "h200-precision-tp1", lambda r: [r.summary["run"]["replication"]["allocation"]["predicted_gpu_minutes"]], "{:.1f}"
)
FIGURES["prec.wall"] = Figure("h200-precision-tp1", lambda r: [r.summary["run"]["gpu_time"]["wall_minutes"]], "{:.1f}")
FIGURES["prec.split"] = Figure(
    "h200-precision-tp1",
    lambda r: [r.summary["run"]["gpu_time"][k] for k in ("starts_minutes", "warmup_minutes", "measure_minutes")],
    "starts {:.1f} min, warm-ups {:.1f}, timed rounds {:.1f}",
)


FIGURES["triton.bw"] = Figure("h200-triton-tp1", bandwidth, "{:.0f} GB/s, {:.0f} %")
FIGURES["fork.bw"] = Figure("h200-fork-tp1", lambda r: [r.manifest["gpu_bandwidth"]["best_gbps"]], "{:.0f} GB/s")


FIGURES["triton.floor.measured"] = Figure(
    "h200-triton-tp1", floors("stock", "measured_over_measured_floor"), "{} / {} / {}"
)
FIGURES["triton.floor.datasheet"] = Figure("h200-triton-tp1", floors("stock", "measured_over_floor"), "{} / {} / {}")
FIGURES["ref.floor"] = Figure(
    "h200-reference-tp1", floors("stock", "measured_over_floor"), "{} at 1K, {} at 8K, {} at 32K"
)
FIGURES["triton.starts"] = Figure("h200-triton-tp1", starts, "{}, {}")
FIGURES["prec.predicted.hw"] = Figure(
    "h200-precision-tp1",
    lambda r: list(r.summary["run"]["replication"]["allocation"]["predicted_half_width_pct"].values()),
    "+-{:.2f} / {:.2f} / {:.2f} %",
)
FIGURES["prec.cold"] = Figure(
    "h200-precision-tp1", lambda r: [s["first_s"] for s in r.summary["startups"]], "{:.0f} / {:.0f} s"
)
FIGURES["prec.sd_server"] = Figure(
    "h200-precision-tp1", lambda r: [100 * r.summary["variance_model"]["sd_server"]], "{:.3f} %"
)
FIGURES["prec.bw"] = Figure("h200-precision-tp1", lambda r: [r.manifest["gpu_bandwidth"]["best_gbps"]], "{:.0f} GB/s")
FIGURES["load.bw"] = Figure(L1, lambda r: [r.manifest["gpu_bandwidth"]["best_gbps"]], "{:.0f} GB/s")
for _d, _k in ((K1, "1k"), (K8, "8k")):
    FIGURES[f"fork.{_k}.cells"] = Figure(
        "h200-fork-tp1", cells_by_pass("stock-fork", _d, "client_estimate_ms"), "{:.2f}, {:.2f}"
    )
FIGURES["fork.starts"] = Figure(
    "h200-fork-tp1",
    lambda r: [r.summary["startups"][0]["first_s"], r.summary["startups"][0]["later_median_s"]],
    "{:.1f} s cold, {:.1f} s warm",
)


def _route_moved(r: RunFolder) -> Sequence[float]:
    """FA3's primed c = 1 step (h200-load-tp1 at 1K/8K, h200-load-32k-tp1 at 32K) against the
    batch-1 cells of h200-reference-tp1 (prefix caching off), in % per depth."""
    ref = RunFolder(r.path.parent / "h200-reference-tp1")
    pts = ((r, K1), (r, K8), (RunFolder(r.path.parent / L32), K32))
    return [100 * (run.load("stock", d)["step_ms"] / arm_geomean("stock", d)(ref)[0] - 1) for run, d in pts]


FIGURES["route.fa3.moved"] = Figure(L1, _route_moved, "{:+.1f} / {:+.1f} / {:+.1f} %")
FIGURES["load8k.fa3.agree"] = Figure(
    L8,
    lambda r: [
        v
        for c in (4, 16, 32)
        for v in sorted((r.load("stock", K8, c)["step_ms"], cell_mean("stock", K8, c, "server_estimate_ms")(r)[0]))
    ],
    "{:.1f}-{:.1f}, {:.1f}-{:.1f}, {:.1f}-{:.1f} ms",
)
FIGURES["load32k.widened.c1.mde"] = Figure(L32, mde("widened", K32, 1), "{:.1f} %")
FIGURES["load32k.widened.c4.mde"] = Figure(L32, mde("widened", K32, 4), "{:.1f} %")
FIGURES["load.stalled.max.s"] = Figure(L1, lambda r: [stalled_ms(r)[1] / 1e3], "{:.1f} s")


def _span(xs: Iterable[float]) -> Sequence[float]:
    got = list(xs)
    return [min(got), max(got)]


FIGURES["demo.mde"] = Figure(
    "cpu-demo", lambda r: sorted(r.comparison("widened", d)["mde_pct"] for d in (256, 1024)), "{:.1f} and {:.1f} %"
)
FIGURES["demo.wall"] = Figure("cpu-demo", lambda r: [r.summary["run"]["gpu_time"]["wall_minutes"]], "{:.1f}")
# the server starts (each arm's first, and the median of its later ones: one each here), every cell's decode
FIGURES["demo.starts"] = Figure(
    "cpu-demo",
    lambda r: _span(s[k] for s in r.summary["startups"] for k in ("first_s", "later_median_s")),
    "{:.0f}-{:.0f} s",
)
FIGURES["demo.decode"] = Figure(
    "cpu-demo", lambda r: _span(c["estimate_ms"] for c in r.summary["cells"]), "{:.0f}-{:.0f} ms"
)
FIGURES["load.mde"] = Figure(
    L1,
    lambda r: [
        min(c["mde_pct"] for c in r.summary["comparisons"] if c["scope"] == "pooled" and c["mde_pct"] is not None),
        max(c["mde_pct"] for c in r.summary["comparisons"] if c["scope"] == "pooled" and c["mde_pct"] is not None),
    ],
    "MDE {:.1f}-{:.1f} %",
)
FIGURES["load.rocm.8k.c1.ms1"] = Figure(L1, step("rocm-attn", K8, 1), "{:.1f}")
FIGURES["load8k.rocm.16to32"] = Figure(
    L8, lambda r: [step("rocm-attn", K8, c)(r)[0] for c in (16, 32)], "{:.0f} to {:.0f}"
)
FIGURES["load8k.fa3.16to32"] = Figure(L8, lambda r: [step("stock", K8, c)(r)[0] for c in (16, 32)], "{:.1f} to {:.1f}")
FIGURES["widened.32k.batch1runs"] = Figure(
    "h200-reference-tp1",
    ratio_span_over_runs(
        ("h200-reference-tp1", "h200-precision-tp1", "h200-neighbour-tp1", "h200-vllm023-tp1"), "widened", K32
    ),
    "{:.3f}-{:.3f}",
)
FIGURES["fa3.32k.c1.batch1runs"] = Figure(
    "h200-reference-tp1",
    cell_span_over_runs(("h200-reference-tp1", "h200-triton-tp1", "h200-precision-tp1"), "stock", K32),
    "{:.2f}-{:.2f}",
)
# Fresh prompts at 8K x 16 read 15.05 ms/step in a hand-run probe on the H200 (route_check, not a
# committed run); the figure is its excess over the committed, stall-checked primed step.
FRESH_8K_C16_MS = 15.05
FIGURES["fresh.vs.primed"] = Figure(
    L8, lambda r: [100 * (FRESH_8K_C16_MS / r.load("stock", K8, 16)["step_ms"] - 1)], "{:+.1f} %"
)


# A run's pooled comparison needs no entry of its own: ratio/RUN/ARM/DEPTH[/cC] is its ratio and
# interval, mde/RUN/ARM/DEPTH[/cC] its MDE (the verdict tables' figures, quoted in prose).
FAMILY = re.compile(r"(?P<kind>ratio|mde)/(?P<run>[\w.\-]+)/(?P<arm>[\w.\-]+)/(?P<depth>\d+)(?:/c(?P<c>\d+))?")


def figure(fid: str) -> Figure | None:
    """The registered figure of an id, or the one a comparison id names; None where neither."""
    if fid in FIGURES:
        return FIGURES[fid]
    if not (m := FAMILY.fullmatch(fid)):
        return None
    arm, depth, c = m["arm"], int(m["depth"]), int(m["c"] or 1)
    if m["kind"] == "ratio":
        return Figure(m["run"], ratio(arm, depth, c), RC)
    return Figure(m["run"], mde(arm, depth, c), "{:.1f}")
