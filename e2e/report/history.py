"""`history DIR`: a series of runs (ordered by vLLM version, or by date): per arm and depth the
decode estimate with its interval, the change points of the series (e2e/stats/changepoints.py: steps
confirmed by the same pooled comparison a run uses) and whether the runs between them held still,
with a table, a CSV and a plot.

Runs are grouped into series by the checked metadata of e2e/report/compare.py (a step between runs of
different models or GPUs is not a regression of vLLM); a run folder that cannot be read is skipped
with a warning, and a folder that holds a run already counted (a link such as `results/latest`, or a
copy) is skipped naming it: each run counts once. Where a split has one run a side the run-to-run
variance cannot be estimated: a stated sd stands in (compare's --run-sd / --run-prior, else the
prior of e2e/analysis/run_prior.py) and the console says it is assumed. Each series states the
smallest step it could have found (changepoints: detectable_pct). Exit status: see MEANING. The
command line (its flags, the order it says things in) is e2e/cli/commands/history.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from e2e import exits
from e2e.analysis.manifest_facts import vllm_version
from e2e.analysis.run_analysis import RunAnalysis
from e2e.design.point import Point
from e2e.errors import UserError
from e2e.report import history_figure, tables
from e2e.report import summary as sm
from e2e.report.compare import CHECKED_METADATA, say_run_sd, unfinished
from e2e.report.history_runs import read_runs
from e2e.report.progress import say
from e2e.report.tables import CONSOLE, Col, Table, col, interval, num, text
from e2e.rundir.formats import VERSIONS
from e2e.rundir.store import write_json_atomic
from e2e.stats import one_arm, outcomes, verdicts
from e2e.stats.changepoints import judge_series
from e2e.stats.run_to_run import RunSd

# a run may add or drop a depth or a concurrency: a series is one arm at one point
SERIES_KEYS = [k for k in CHECKED_METADATA if k not in ("depths", "concurrency")]

MEANING = {
    exits.OK: "done: no slower step, and every stretch between steps held within the min effect",
    exits.FAILED: 'done: a "slower" step',
    exits.CANNOT_DECIDE: "done, but it cannot tell: a stretch of runs not shown within the min effect "
    "(inconclusive; --allow-inconclusive accepts it), too few servers, an arm inert in a run of its series, "
    "or no series of two runs",
}

# The console's view of the history (history.csv has every field: summary.HISTORY): the runs once,
# then each point by the run's number, then one line per series; 100 columns hold all three.
RUNS = Table(
    "history-runs",
    (
        col("order", "#", "{}", CONSOLE),
        col("run", "run", None, CONSOLE),
        col("vllm", "vLLM", None, CONSOLE),
        col("time_order", "in time", "{}", CONSOLE),
        Col("started", lambda r: text(r.get("started"))[:16].replace("T", " "), views=CONSOLE),
        Col("finished", lambda r: "yes" if r.get("finished") else "NO", views=CONSOLE),
        col("series", "series", "{}", CONSOLE),
    ),
)
POINTS = Table(
    "history-points",
    (
        col("order", "#", "{}", CONSOLE),
        col("arm", "arm", None, CONSOLE),
        Col("depth", lambda r: str(Point.of(r)), views=CONSOLE),
        col("estimate_ms", "ms/tok", views=CONSOLE),
        Col("95 % CI", lambda r: interval(r.get("ci_lo_ms"), r.get("ci_hi_ms")), views=CONSOLE),
        Col(
            "servers",
            lambda r: f"{r['n_cells']}" + ("*" if r.get("ci_kind") == verdicts.WITHIN_ONE else ""),
            views=CONSOLE,
        ),
    ),
)


def _answer(r: dict[str, Any]) -> str:
    return {
        verdicts.SLOWER: "slower step",
        verdicts.FASTER: "faster step",
        verdicts.EQUIVALENT: "no change point",
        verdicts.INCONCLUSIVE: "cannot tell",
    }.get(r["decision"], r["decision"])


def _colour(r: dict[str, Any]) -> str | None:
    w = outcomes.latency(r.get("decision"))
    return w.colour if w else None


SERIES = Table(
    "history-series",
    (
        col("series", "series", "{}", CONSOLE),
        col("arm", "arm", None, CONSOLE),
        Col("depth", lambda r: str(Point.of(r)), views=CONSOLE),
        Col("answer", _answer, views=CONSOLE, colour=_colour),
        Col("at", lambda r: f"{r['after']} | {r['first']}" if r.get("first") is not None else "-", views=CONSOLE),
        col("ratio", "ratio", "{:.3f}", CONSOLE),
        Col("95 % CI", lambda r: interval(r.get("ratio_ci_lo"), r.get("ratio_ci_hi"), "{:.3f}"), views=CONSOLE),
        col("mde_pct", "MDE %", "{:.1f}", CONSOLE),
        col("detectable_pct", "finds %", "{:.1f}", CONSOLE),
    ),
)


@dataclass
class History:
    """runs: one row per run in series order. rows: one per (run, arm, depth) with the pooled
    estimate (history.csv). steps: the change points of each series (same checked metadata), arm and
    depth. answers: per series, arm and depth, its answer (a step's word, else how the stretches
    between steps held) and the comparison it rests on."""

    runs: list[dict[str, Any]]
    rows: list[dict[str, Any]]
    steps: list[dict[str, Any]]
    answers: list[dict[str, Any]]


def _tabulate(runs: list[RunAnalysis]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[list[int]]]:
    """(one row per run, one row per run, arm and point, each series' runs by their place in runs).
    A series is the runs whose checked metadata match (SERIES_KEYS)."""
    rows, table = [], []
    series: dict[tuple[str, ...], list[int]] = {}
    # each run's place in time (1 = first started), shown beside its version: a version order
    # is not the order the runs were measured in
    in_time = {id(r): n for n, r in enumerate(sorted(runs, key=lambda r: r.manifest.get("started") or ""), 1)}
    for i, r in enumerate(runs):
        key = tuple(repr(CHECKED_METADATA[k](r)) for k in SERIES_KEYS)
        series.setdefault(key, []).append(i)
        finished = unfinished(r) is None
        table.append(
            {
                "order": i,
                "run": r.root.name,
                "vllm": vllm_version(r.manifest),
                "time_order": in_time[id(r)],
                "started": r.manifest.get("started"),
                "finished": finished,
                "series": list(series).index(key),
            }
        )
        for arm in r.arms:
            for d in r.points:
                rows.append(
                    {
                        **table[-1],
                        "arm": arm,
                        **d.fields(),
                        "estimator": r.estimator,
                        **one_arm.arm_estimate(r.fit, arm, d, r._cells_of(arm, d)),
                    }
                )
    return table, rows, list(series.values())


def _judge(
    runs: list[RunAnalysis], s: int, arm: str, d: Point, idx: list[int], n_series: int, run_sd: RunSd | None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One series' change points (with the kernels that moved across each) and its answer: a step's
    word, else how the stretches between steps held, and the comparison it rests on."""
    sd = run_sd.sd(d, arm == runs[idx[0]].reference) if run_sd is not None else 0.0
    res = judge_series(
        [runs[i]._cells_of(arm, d) for i in idx],
        runs[idx[0]].alpha,
        runs[idx[0]].min_effect_pct,
        labels=[runs[i].root.name for i in idx],
        n_series=n_series,
        run_sd=sd,
    )
    at = {runs[i].root.name: i for i in idx}
    here = {"series": s, "arm": arm, **d.fields(), "n_series": n_series}
    steps = [
        _with_kernels(
            {**here, "after_run": cp.runs_before[-1], "first_run": cp.runs_after[0], **cp.to_dict()},
            runs[at[cp.runs_before[-1]]],
            runs[at[cp.runs_after[0]]],
            arm,
            d,
        )
        for cp in res.steps
    ]
    # what the answer rests on: the first step, else the stretch least shown to hold still
    doubt = min((x for x in res.stretches if x.worst), key=lambda x: x.decision == verdicts.EQUIVALENT, default=None)
    shown = res.steps[0] if res.steps else doubt.worst if doubt else None
    head = shown.to_dict() if shown else {}
    answer = {
        **here,
        "decision": res.decision,
        "runs": [runs[i].root.name for i in idx],
        "after": at[shown.runs_before[-1]] if shown else None,
        "first": at[shown.runs_after[0]] if shown else None,
        **{k: head.get(k) for k in ("ratio", "ratio_ci_lo", "ratio_ci_hi", "mde_pct", "p_adjusted")},
        "note": (head.get("warnings") or [None])[-1],
        "detectable_pct": res.detectable_pct,
        "run_sd_pct": 100 * sd if res.run_sd_assumed else 0.0,
        "one_run_per_release": _one_run_per_release([runs[i] for i in idx]),
        "stretches": [x.to_dict() for x in res.stretches],
    }
    # an arm whose patch changed nothing in a run of the series (e2e/rundir/patch_evidence.py) ran the
    # reference's code there: the series reads inert, as the run's own verdict does
    inert = [runs[i].root.name for i in idx if any(x["arm"] == arm and Point.of(x) == d for x in runs[i].inert)]
    if inert:
        verdicts.read_inert(answer, inert_runs=inert)
    return steps, answer


def history(runs: list[RunAnalysis], run_sd: RunSd | None = None) -> History:
    """The history of runs in series order (read_runs); run_sd: the run-to-run sd assumed where a
    split has one run a side (None: servers of different runs taken as exchangeable there)."""
    table, rows, series = _tabulate(runs)
    todo = []
    for s, members in enumerate(series):
        arms_points = sorted({(row["arm"], Point.of(row)) for row in rows if row["order"] in members})
        for arm, d in arms_points:
            idx = [i for i in members if runs[i]._cells_of(arm, d)]
            if len(idx) >= 2:
                todo.append((s, arm, d, idx))
    steps, answers = [], []
    # one family: every arm x depth series of the history (Bonferroni over them in changepoints)
    for s, arm, d, idx in todo:
        found, answer = _judge(runs, s, arm, d, idx, len(todo), run_sd)
        steps += found
        answers.append(answer)
    return History(table, rows, steps, answers)


def _one_run_per_release(runs: list[RunAnalysis]) -> bool:
    versions = [vllm_version(r.manifest) for r in runs]
    return len(set(versions)) == len(versions)


def status_of(steps: list[dict[str, Any]], answers: list[dict[str, Any]], allow_inconclusive: bool) -> int:
    """1 a slower step; 3 a series that cannot tell (unless allowed), an inert one, or no series of two
    runs; else 0."""
    if not answers:
        return exits.CANNOT_DECIDE
    words = [s["decision"] for s in steps] + [
        x["decision"] for a in answers for x in a["stretches"] if len(x["runs"]) > 1
    ]
    words += [a["decision"] for a in answers if a["decision"] == verdicts.INERT]
    return outcomes.status_of(words, inconclusive_ok=allow_inconclusive)


def _with_kernels(step: dict[str, Any], before: RunAnalysis, after: RunAnalysis, arm: str, d: Point) -> dict[str, Any]:
    """A change point with the kernels that moved across it (the runs either side; e2e/profile/section.py),
    where both have a profile there."""
    from e2e.profile.section import between_runs

    ea = one_arm.arm_estimate(before.fit, arm, d, before._cells_of(arm, d))["estimate_ms"]
    eb = one_arm.arm_estimate(after.fit, arm, d, after._cells_of(arm, d))["estimate_ms"]
    k = between_runs(before.root, after.root, arm, d, eb - ea if ea is not None and eb is not None else None)
    return {**step, "kernels": k} if k is not None else step


def say_history(console: Console, h: History, title: str) -> None:
    """The runs once, each point by its run's number, then the answer of every series."""
    rows, answers = h.rows, h.answers
    console.print(tables.render_console(RUNS, h.runs, escape(title)))
    console.print(tables.render_console(POINTS, rows, "each run's points (# above)"))
    if any(r.get("ci_kind") == verdicts.WITHIN_ONE for r in rows):
        say(console, "servers*: one server at that point, so its interval is within that server only")
    if not answers:
        say(console, "no series holds two runs with a point in common: nothing to compare")
        return
    a0 = answers[0]
    console.print(
        tables.render_console(
            SERIES,
            answers,
            f"change points per series, arm and depth (at: the runs # | # either side; Bonferroni over "
            f"{a0['n_series']} series; finds %: the smallest step it could have found, 80 % power)",
        )
    )
    at = {r["run"]: r["order"] for r in h.runs}
    for a in answers:
        where = f"{a['arm']} at {Point.of(a)} (series {a['series']})"
        steps = [x for x in h.steps if (x["series"], x["arm"], Point.of(x)) == (a["series"], a["arm"], Point.of(a))]
        for x in steps:
            say(
                console,
                f"{where}: {x['decision']} step between #{at[x['after_run']]} and #{at[x['first_run']]}: ratio "
                f"{num(x['ratio'], '{:.3f}')} ({interval(x['ratio_ci_lo'], x['ratio_ci_hi'], '{:.3f}')}), "
                f"p adj {num(x['p_adjusted'], '{:.3g}')}",
            )
            if x.get("kernels"):
                k = x["kernels"]
                top = ", ".join(f"{y['name'][:48]} {y['ms']:+.3f}" for y in k["top"][:3])
                say(console, f"{where}: kernels that moved {k['kernels_ms']:+.3f} ms/step ({top})")
        doubt = [x for x in a["stretches"] if len(x["runs"]) > 1 and x["decision"] != verdicts.EQUIVALENT]
        for x in doubt:
            w = x["worst"]
            if w is None:
                say(
                    console,
                    f"{where}: cannot tell: too few servers to test a split of #{at[x['runs'][0]]} to "
                    f"#{at[x['runs'][-1]]}",
                )
                continue
            note = (w["warnings"] or [f"{w['decision']}"])[-1].removeprefix(f"{verdicts.INCONCLUSIVE}: ")
            say(
                console,
                f"{where}: cannot tell between #{at[w['runs_before'][-1]]} and #{at[w['runs_after'][0]]}: {note}",
            )
        if a.get("inert_runs"):
            runs_at = ", ".join(f"#{at[n]}" for n in a["inert_runs"])
            say(console, f"{where}: inert in {runs_at}: its patch changed nothing there, so the series reads inert")
        if not steps and not doubt and not a.get("inert_runs"):
            say(console, f"{where}: no change point; every split tested within the min effect")


def read_history(
    folder: Path, order_by: str, match: str | list[str], console: Console
) -> tuple[list[RunAnalysis], list[str], list[str]]:
    """(the runs in series order, the folders skipped, the runs not finished), each warning said."""
    runs, skipped = read_runs(folder, order_by, match)
    for w in skipped:
        say(console, f"warning: {w}", "yellow")
    if not runs:
        raise UserError(f"history: no readable run folder under {folder}")
    short = [w for w in map(unfinished, runs) if w]
    for w in short:  # its rows are in the series, for what they hold; the reader must know it stopped short
        say(console, f"warning: RUN NOT FINISHED: {w}", "bold yellow")
    return runs, skipped, short


def say_assumed(console: Console, run_sd: RunSd, h: History) -> None:
    """What the series cannot tell apart: a run-to-run sd assumed, one run per release."""
    say_run_sd(console, run_sd, [a["run_sd_pct"] for a in h.answers], "a split with one run a side")
    if any(a["one_run_per_release"] and len(a["runs"]) > 2 for a in h.answers):
        say(
            console,
            "one run per release: the run-to-run sd is estimated from runs of different releases, so a "
            "release's own change and the machine's day cannot be told apart",
            "yellow",
        )


def write_history(
    console: Console,
    out: Path,
    h: History,
    order_by: str,
    skipped: list[str],
    run_sd: RunSd,
    short: list[str],
    status: int,
) -> None:
    """history.csv, history.json and history.png (none, and an earlier one removed, when no run has
    an estimate) in out, and a line that says so."""
    tables.write_table_csv(out / "history.csv", sm.HISTORY, h.rows, VERSIONS["history"])
    write_json_atomic(
        out / "history.json",
        {
            "schema_version": VERSIONS["history"],
            "kind": "e2e-history",
            "order_by": order_by,
            "runs": h.rows,
            "change_points": h.steps,
            "series": h.answers,
            "skipped": skipped,
            "run_sd_source": run_sd.source,
            "unfinished": short,
            "exit_status": status,
        },
    )
    fig = history_figure.draw(h.rows, h.steps, order_by, out / "history.png", h.answers)
    if fig is None and (out / "history.png").is_file():
        (out / "history.png").unlink()  # an earlier history's figure: this one has nothing to draw
    say(
        console,
        f"wrote {out / 'history.csv'}, history.json"
        + (" and history.png" if fig else " (no figure: no run has an estimate)"),
    )


def say_status(console: Console, h: History, status: int) -> None:
    allowed = status == exits.OK and any(
        x["decision"] != verdicts.EQUIVALENT for a in h.answers for x in a["stretches"] if len(x["runs"]) > 1
    )
    meaning = "done: no slower step; stretches it cannot tell allowed" if allowed else MEANING[status]
    say(console, f"exit status {status}: {meaning}")
