"""`compare RUN_A RUN_B`: is B slower than A? The within-run rule between runs.

For every arm in both runs and every common depth, run B's servers against run A's: one variance
model over both runs' servers and depths (e2e/stats/variance_model.py; each run's arm a group, a server
one replicate), decided with Holm's correction across the arm x depth family. Two runs cannot show
run-to-run variation beyond their servers (`history` over several runs of a release can:
e2e/stats/changepoints.py), so each comparison is widened by a stated run-to-run sd, one run a side
(e2e/stats/run_to_run.py; the prior of e2e/analysis/run_prior.py unless --run-sd, --run-prior or
run A's stats.run_sd_pct says otherwise), and the console says it is assumed, not measured. Runs are
comparable only when the CHECKED metadata match (pyperf's rule); a mismatch is refused unless
--force, and then every mismatch is printed.

Exit status (MEANING): 0 no regression (every row faster or equivalent), 1 a regression (a row
"slower"), 2 bad input or error, 3 cannot decide (a row inconclusive: it cannot tell, unless
--allow-inconclusive; a run without valid cells, an arm missing from B, a row with insufficient
replication, or a row whose arm is inert in either run: its patch changed nothing there). A gate
never passes blind: a row whose interval reaches past the min effect is not a pass. The command line
(its flags, the order it says things in) is e2e/cli/commands/compare.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from e2e import exits
from e2e.analysis import run_prior
from e2e.analysis.manifest_facts import gpu_name, vllm_version
from e2e.analysis.run_analysis import RunAnalysis
from e2e.design.point import Point
from e2e.errors import UserError
from e2e.report import summary as sm
from e2e.report.progress import say
from e2e.report.tables import render_console
from e2e.rundir import identity, patch_evidence
from e2e.rundir.formats import VERSIONS
from e2e.rundir.store import FINISHED
from e2e.stats import one_arm, outcomes, run_to_run, verdicts

REGRESSION, CANNOT_DECIDE = exits.FAILED, exits.CANNOT_DECIDE
MEANING = {
    exits.OK: "done: no regression (every row faster or equivalent)",
    REGRESSION: 'done: a regression (a row "slower")',
    CANNOT_DECIDE: "done, but it cannot decide (a row inconclusive, inert or without the servers to decide, "
    "or an arm or run without cells)",
}


def _flag(a: RunAnalysis, flag: str, default: str) -> str:
    """A `vllm serve` flag's value as the reference arm ran it (server args and arm args)."""
    argv: list[str] = ((a.manifest.get("arms") or {}).get(a.reference or "", {}) or {}).get("server_argv") or []
    for i, x in enumerate(argv):
        if x == flag and i + 1 < len(argv):
            return argv[i + 1]
        if x.startswith(flag + "="):
            return x.split("=", 1)[1]
    return default


# name -> how to read it from an analysed run. Runs that differ in any of these are "not
# comparable", never pooled or compared (unless --force).
CHECKED_METADATA: dict[str, Callable[[RunAnalysis], Any]] = {
    "model": lambda a: (a.manifest.get("model") or {}).get("path"),
    "twin_of": lambda a: (a.manifest.get("model") or {}).get("twin_of"),
    "tensor_parallel_size": lambda a: a.tp,
    "gpu": lambda a: gpu_name(a.manifest),
    "dtype": lambda a: _flag(a, "--dtype", "auto"),
    "kv_cache_dtype": lambda a: _flag(a, "--kv-cache-dtype", "auto"),
    "graph_mode": lambda a: a.config.server.graph_mode,
    "server_mode": lambda a: a.manifest.get("server_mode"),
    "depths": lambda a: sorted({p.depth for p in a.points}),
    # requests decoding together per round (1 before batch sizes above 1)
    "concurrency": lambda a: sorted({p.concurrency for p in a.points}),
    "long_tokens": lambda a: a.n_long,
    "short_tokens": lambda a: a.n_short,
    "alpha": lambda a: a.alpha,
    "min_effect_pct": lambda a: a.min_effect_pct,
}


def metadata_mismatches(a: RunAnalysis, b: RunAnalysis) -> list[str]:
    out = []
    for name, get in CHECKED_METADATA.items():
        va, vb = get(a), get(b)
        if va != vb:
            out.append(f"{name}: {va!r} vs {vb!r}")
    return out


def unfinished(r: RunAnalysis) -> str | None:
    """Why run r is not a finished run (its status, the planned cells it lacks), or None. Its rows
    still compare; the reader must know the run stopped short (the report's banner, here a line)."""
    if r.status in FINISHED:
        return None
    return f"{r.root.name} is not finished (status {r.status})" + (
        f": {len(r.missing)} of {len(r.plan)} planned cell(s) not run ({', '.join(r.missing)})" if r.missing else ""
    )


def compare_runs(
    a: RunAnalysis,
    b: RunAnalysis,
    arms: list[str] | None = None,
    allow_inconclusive: bool = False,
    run_sd: run_to_run.RunSd | None = None,
) -> tuple[list[dict[str, Any]], str, list[str]]:
    """(rows, the correction line, reasons the comparison cannot decide). Rows: arm, depth, run A
    and run B pooled estimates, and the B/A comparison with its decision, widened by run_sd (one
    run a side; None: servers of the two runs taken as exchangeable) and its sd in run_sd_pct.
    Alpha and min effect are run A's (the baseline's); --force with different ones says so. An
    inconclusive row cannot decide unless allow_inconclusive."""
    if arms is not None:
        for x in arms:
            if x not in a.arms or x not in b.arms:
                raise UserError(f"--arm {x!r} is not in both runs (A: {a.arms}, B: {b.arms})")
    common = arms or [x for x in a.arms if x in b.arms]
    if not common:
        raise UserError(f"the runs share no arm (A: {a.arms}, B: {b.arms}): name one with --arm")
    undecidable = [f"{r.root.name} has no valid cell" for r in (a, b) if not r.cells]
    if arms is None:
        undecidable += [f"arm {x!r} of {a.root.name} is missing from {b.root.name}" for x in a.arms if x not in b.arms]
    points = sorted(set(a.points) & set(b.points))
    ca, cb = (
        [(arm, p, r.server_of[(arm, p, n)], cs) for (arm, p, n), cs in r.cells.items() if arm in common] for r in (a, b)
    )
    fit, entries, line = run_to_run.two_runs(ca, cb, common, points, a.reference, a.alpha, a.min_effect_pct, run_sd)
    rows = [
        {
            "arm": x.arm,
            **x.point.fields(),
            "a": one_arm.arm_estimate(fit, f"A:{x.arm}", x.point, x.a),
            "b": one_arm.arm_estimate(fit, f"B:{x.arm}", x.point, x.b),
            "run_sd_pct": 100 * x.run_sd,
            **x.comparison.to_dict(),
        }
        for x in entries
    ]
    for r in rows:  # which kernels moved, where both runs have a profile there (e2e/profile/section.py)
        if (k := _kernels_moved(a, b, r)) is not None:
            r["kernels"] = k
    _mark_inert(a, b, rows)
    undecidable += [
        f"{r['arm']} at {Point.of(r)}: {r['decision']}"
        for r in rows
        if outcomes.status_of([r["decision"]], inconclusive_ok=allow_inconclusive) == exits.CANNOT_DECIDE
    ]
    return rows, line, undecidable


def _mark_inert(a: RunAnalysis, b: RunAnalysis, rows: list[dict[str, Any]]) -> None:
    """A row whose arm is inert at its point in either run (its patch changed nothing there: it ran the
    reference's code, e2e/rundir/patch_evidence.py) reads inert, as in the run's own report, whatever
    the numbers say (kept as decision_measured); `inert` holds each side's findings."""
    found = {(side, i["arm"], Point.of(i)): i["findings"] for side, r in (("a", a), ("b", b)) for i in r.inert}
    for row in rows:
        sides = {s: f for s in ("a", "b") if (f := found.get((s, row["arm"], Point.of(row))))}
        if not sides:
            continue
        verdicts.read_inert(row, inert=sides)
        for s, f in sides.items():
            name = (a if s == "a" else b).root.name
            seen = "; ".join(patch_evidence.describe(x) for x in f)
            row["warnings"] = [*row["warnings"], f"inert in run {s.upper()} ({name}): {seen}"]


def _kernels_moved(a: RunAnalysis, b: RunAnalysis, row: dict[str, Any]) -> dict[str, Any] | None:
    """B minus A for one row's arm and point, attributed to kernels; None without a profile on both sides."""
    from e2e.profile.section import between_runs

    ea, eb = row["a"].get("estimate_ms"), row["b"].get("estimate_ms")
    measured = eb - ea if ea is not None and eb is not None else None
    return between_runs(a.root, b.root, row["arm"], Point.of(row), measured)


def kernels_line(row: dict[str, Any]) -> str | None:
    """One line: the kernels that moved most between the runs, and what the profile does not carry."""
    k = row.get("kernels")
    if not k:
        return None
    top = ", ".join(f"{x['name'][:48]} {x['ms']:+.3f}" for x in k["top"][:3])
    rest = "" if k["not_in_profile_ms"] is None else f"; not in the profile {k['not_in_profile_ms']:+.3f}"
    return f"{row['arm']} at {Point.of(row)}: kernels B - A {k['kernels_ms']:+.3f} ms/step ({top}; other {k['other_kernels_ms']:+.3f}{rest})"


def run_sd_of(r: RunAnalysis, run_sd_pct: float | None = None, prior_file: str | None = None) -> run_to_run.RunSd:
    """--run-sd's, else --run-prior FILE's, else run r's config stats.run_sd_pct, else the stated prior
    (named and widened where r ran on another GPU than the prior's)."""
    pct = r.config.stats.run_sd_pct
    return run_prior.run_sd(run_sd_pct, prior_file, pct, gpu_name(r.manifest))


def say_run_sd(console: Console, run_sd: run_to_run.RunSd, applied: list[float], what: str) -> None:
    """The confound, named: one run per release cannot tell the release from the machine's day."""
    if any(applied):
        lo, hi = min(x for x in applied if x), max(applied)
        sds = f"{lo:.2g} %" if f"{lo:.2g}" == f"{hi:.2g}" else f"{lo:.2g}-{hi:.2g} %"
        say(
            console,
            f"one run per release ({what}): a run-to-run sd of {sds} is assumed, not measured ({run_sd.source})",
            "yellow",
        )
    elif run_sd.off:
        say(
            console,
            f"one run per release ({what}): no run-to-run sd assumed ({run_sd.source}): "
            "servers of different runs taken as exchangeable",
            "yellow",
        )


@dataclass
class Comparison:
    """Run B against run A (compare_pair): what may make them incomparable or unfinished, and the rows
    with the correction line and the reasons it cannot decide (compare_runs)."""

    a: RunAnalysis
    b: RunAnalysis
    mismatches: list[str]
    code: dict[str, dict[str, Any]]
    unfinished: list[str]
    run_sd: run_to_run.RunSd
    rows: list[dict[str, Any]]
    line: str
    undecidable: list[str]
    allow_inconclusive: bool

    @property
    def regressions(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if outcomes.LATENCY[r["decision"]].regression]

    @property
    def status(self) -> int:
        """0 no regression, 1 regression, 3 cannot decide (2: bad input, from cli.main)."""
        words = (r["decision"] for r in self.rows)
        allow = self.allow_inconclusive
        return exits.worst(
            [outcomes.status_of(words, inconclusive_ok=allow)] + [CANNOT_DECIDE] * bool(self.undecidable)
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": VERSIONS["compare"],
            "kind": "e2e-compare",
            "run_a": str(self.a.root),
            "run_b": str(self.b.root),
            "metadata_mismatches": self.mismatches,
            "unfinished": self.unfinished,
            "code": self.code,
            "correction": self.line,
            "run_sd_source": self.run_sd.source,
            "rows": self.rows,
            "regressions": len(self.regressions),
            "cannot_decide": self.undecidable,
            "allow_inconclusive": self.allow_inconclusive,
            "exit_status": self.status,
        }


def analysed_pair(run_a: str | Path, run_b: str | Path, console: Console) -> tuple[RunAnalysis, RunAnalysis]:
    """Both runs analysed, on one estimator at every point: where one run's rows are on the client
    and the other's are not, both on the plain client estimate there (said as a warning)."""
    a, b = RunAnalysis(run_a), RunAnalysis(run_b)
    differ = a.on_client() ^ b.on_client()
    if differ:  # one definition for both sides of a row: the plain one both runs' rows have
        shown = ", ".join(f"{arm} at {p}" for arm, p in sorted(differ, key=lambda x: (x[1], x[0])))
        say(
            console,
            f"warning: the runs' estimators differ at {shown}: there both are compared on the plain client estimate",
            "yellow",
        )
        a, b = RunAnalysis(run_a, client_at=differ), RunAnalysis(run_b, client_at=differ)
    return a, b


def compare_pair(
    run_a: str | Path,
    run_b: str | Path,
    console: Console,
    arms: list[str] | None = None,
    force: bool = False,
    allow_inconclusive: bool = False,
    run_sd_pct: float | None = None,
    prior_file: str | None = None,
) -> Comparison:
    """Run B against run A, saying on the console what the reader must know first: metadata that
    differ (refused unless force), code not identified, a run not finished."""
    a, b = analysed_pair(run_a, run_b, console)
    mism = metadata_mismatches(a, b)
    if mism and not force:
        raise UserError(f"runs are not comparable ({'; '.join(mism)}): use --force to compare anyway")
    for m in mism:
        say(console, f"warning: metadata differ (forced): {m}", "yellow")
    code = {r.root.name: identity.describe(r.manifest) for r in (a, b)}
    for name, c in code.items():
        if not c["identified"]:
            say(console, f"warning: CODE NOT IDENTIFIED in {name}: {c['line']}", "bold red")
    short = [w for w in map(unfinished, (a, b)) if w]
    for w in short:
        say(console, f"warning: RUN NOT FINISHED: {w}", "bold yellow")
    run_sd = run_sd_of(a, run_sd_pct, prior_file)
    rows, line, undecidable = compare_runs(a, b, arms, allow_inconclusive, run_sd)
    return Comparison(a, b, mism, code, short, run_sd, rows, line, undecidable, allow_inconclusive)


def say_comparison(console: Console, c: Comparison) -> None:
    """The rows, how they were decided, the run-to-run sd assumed, and each row's warnings and kernels."""
    a, b, rows = c.a, c.b, c.rows
    title = (
        f"B = {b.root.name} (vLLM {vllm_version(b.manifest)}) vs A = {a.root.name} (vLLM {vllm_version(a.manifest)})"
    )
    console.print(render_console(sm.COMPARE, rows, escape(title)))
    say(console, f"decided with {c.line}; alpha {a.alpha:g} and min effect {a.min_effect_pct:g} % of run A")
    say_run_sd(console, c.run_sd, [r["run_sd_pct"] for r in rows], "one run a side")
    for r in rows:
        for w in r["warnings"]:
            say(console, f"warning: {r['arm']} at {Point.of(r)}: {w}")
    for r in rows:
        if line_k := kernels_line(r):
            say(console, line_k)


def say_outcome(console: Console, c: Comparison) -> None:
    """The answer in a line, then the exit status and what it means."""
    inconclusive = [r for r in c.rows if r["decision"] == verdicts.INCONCLUSIVE]
    if c.regressions:
        say(console, f"{len(c.regressions)} regression(s): B slower beyond {c.a.min_effect_pct:g} %", "red")
    elif c.undecidable:
        say(console, "cannot decide: " + "; ".join(c.undecidable), "yellow")
    elif inconclusive:  # allowed: said, never read as a pass
        say(console, f"no row slower; {len(inconclusive)} inconclusive, allowed by --allow-inconclusive", "yellow")
    else:
        say(console, "no regression: every row faster or equivalent")
    status = c.status
    meaning = (
        "done: no row slower; inconclusive rows allowed" if status == exits.OK and inconclusive else MEANING[status]
    )
    say(console, f"exit status {status}: {meaning}")
