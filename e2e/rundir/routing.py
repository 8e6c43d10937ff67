"""Routing records -> the cell row's `routing`: fold what the plugin wrote in every vLLM process
of one server (e2e/plugin/recorder.py writes them), and judge whether the arm's patches were proven
applied in every process that needed them.

`routing["warnings"]` says, in words that name the vLLM version, why the routing of a cell is not a
result even though its latency is: a hook of the recorder not found in a process that serves the
model (e2e/plugin/targets.py), a live process of the server that wrote no record, no record from a
process that serves the model, no layer class counted. `routing["hooks"]` is the per-target detail.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import psutil

from e2e.design.config import ArmCfg
from e2e.plugin import targets
from e2e.plugin.contract import ENV_RECORD_DIR, RECORD_SCHEMA_PREFIX
from e2e.plugin.recorder import GRAPH_NOTE_FULL
from e2e.rundir import patch_evidence


def read_records(record_dir: Path) -> list[dict[str, Any]]:
    out = []
    for p in sorted(Path(record_dir).glob("*.json")):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, json.JSONDecodeError):
            continue  # cannot happen with os.replace; a foreign file is not a record
    return [r for r in out if str(r.get("schema", "")).startswith(RECORD_SCHEMA_PREFIX)]


def _fresh_records(record_dir: Path, since: float, wait_s: float | None) -> list[dict[str, Any]]:
    """Records written after `since` (the processes flush every flush_s); waits for live ones."""
    recs = read_records(record_dir)
    limit = wait_s if wait_s is not None else 2.5 * max([r.get("flush_s", 1.0) for r in recs] or [1.0])
    deadline = time.monotonic() + limit
    while any(not r.get("final") and r.get("written_unix", 0) < since for r in recs) and time.monotonic() < deadline:
        time.sleep(0.1)
        recs = read_records(record_dir)
    for r in recs:
        r["_stale"] = not r.get("final") and r.get("written_unix", 0) < since
    return recs


def _proc_label(r: dict[str, Any]) -> str:
    rank = r.get("rank")
    return f"{r.get('role')}{'' if rank is None else f' rank {rank}'} pid {r.get('pid')}"


def fold_records(
    record_dir: Path, arm: ArmCfg, wait_s: float | None = None, before: patch_evidence.Functions | None = None
) -> dict[str, Any]:
    """Fold the per-process records of one server into the cell row's `routing`.

    Counts are cumulative since the server started (a server shared by several cells keeps
    counting). Per layer class: which paths, how often, in which processes; the gate's answers.
    With patches that the records counted, `patched` (e2e/rundir/patch_evidence.py): the patched
    functions' calls since the server started and in this cell (less `before`, the server's
    previous cell's total).
    """
    since = time.time()
    recs = _fresh_records(Path(record_dir), since, wait_s)
    notes = sorted({r["counts_note"] for r in recs if r.get("counts_note")})
    modes = sorted({r["routing_mode"] for r in recs if r.get("routing_mode")})
    out: dict[str, Any] = {
        "arm": arm.name,
        "patches": list(arm.patches),
        "n_processes": len(recs),
        "processes": [_process_row(r) for r in recs],
        "layer_classes": _layer_classes(recs),
        "gate": _gate_calls(recs),
        "counts_since": "server start",
        "counts_note": notes,
        "routing_mode": modes,
        "cudagraph_modes": sorted({str(r.get("cudagraph_mode")) for r in recs if r.get("runs_model")}),
    }
    live = serving_processes(Path(record_dir))
    out["unrecorded_processes"] = (
        []
        if live is None
        else [
            {"pid": pid, "cmdline": cmd} for pid, cmd in sorted(live.items()) if pid not in {r.get("pid") for r in recs}
        ]
    )
    total = patch_evidence.fold(recs) if arm.patches else None
    if total is not None:  # only where counted: rows without it are never judged inert
        full = GRAPH_NOTE_FULL in notes  # replays run no Python: the capture's calls speak for every cell
        out["patched"] = patch_evidence.evidence(total, patch_evidence.since(total, before), full)
    out["hooks"] = hook_table(recs)
    out["warnings"] = routing_warnings(recs, out, live is not None)
    out["warnings"] += step_gaps(out)
    if "per-step" in modes:
        # complete only where every model-serving process counted steps and ran no full graphs
        out["per_step_complete"] = all(
            ("FULL" not in str(r.get("cudagraph_mode")) or r.get("enforce_eager")) and (r.get("model_steps") or 0) > 0
            for r in recs
            if r.get("runs_model")
        )
    return out


def _process_row(r: dict[str, Any]) -> dict[str, Any]:
    """One process as the folded `routing` lists it."""
    return {
        "label": _proc_label(r),
        "role": r.get("role"),
        "rank": r.get("rank"),
        "pid": r.get("pid"),
        "process_name": r.get("process_name"),
        "runs_model": r.get("runs_model"),
        "tp_size": r.get("tp_size"),
        "patches_requested": r.get("patches_requested"),
        "patches_applied": r.get("patches_applied"),
        "gate": r.get("gate"),
        "vllm_version": r.get("vllm_version"),
        "plugin_dist": r.get("plugin_dist"),
        "cudagraph_mode": r.get("cudagraph_mode"),
        "enforce_eager": r.get("enforce_eager"),
        "model_steps": r.get("model_steps"),
        "error": r.get("error"),
        "stale": r["_stale"],
        "final": r.get("final"),
        "hooked": r.get("hooked"),
        "serves_model": _serves_model(r),
        "hook_status": r.get("hook_status"),
    }


def _layer_class(classes: dict[str, dict[str, Any]], key: str, geometry: Any) -> dict[str, Any]:
    return classes.setdefault(
        key, {"layer_class": key, "geometry": geometry, "n_layers": 0, "paths": {}, "kernel_args": {}, "processes": []}
    )


def _layer_classes(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per layer class, over every process: its layers, the paths it took (counts summed), the kernel
    arguments seen per path, the processes it ran in, and the decisive path; sorted by class."""
    classes: dict[str, dict[str, Any]] = {}
    for r in recs:
        label = _proc_label(r)
        for key, info in (r.get("layers") or {}).items():
            c = _layer_class(classes, key, info.get("geometry"))
            c["n_layers"] = max(c["n_layers"], len(info.get("layers") or []))
            if label not in c["processes"]:
                c["processes"].append(label)
        for cnt in r.get("counts") or []:
            c = _layer_class(classes, cnt["layer_class"], None)
            c["paths"][cnt["path"]] = c["paths"].get(cnt["path"], 0) + cnt["n"]
            if cnt.get("kernel_args"):
                ka = c["kernel_args"].setdefault(cnt["path"], [])
                if cnt["kernel_args"] not in ka:
                    ka.append(cnt["kernel_args"])
            if label not in c["processes"]:
                c["processes"].append(label)
    for c in classes.values():
        c["path"] = decisive_path(c["paths"])
    return sorted(classes.values(), key=lambda c: c["layer_class"])


# What makes two gate calls the same question (the gate's answer included).
_GATE_KEY = (
    "layer_class",
    "qtype",
    "head_size",
    "block_size",
    "gqa_ratio",
    "sliding_window",
    "kv_cache_dtype",
    "answer",
)


def _gate_calls(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The gate's distinct calls over every process, with how often and where each was asked."""
    gate: dict[tuple[str, ...], dict[str, Any]] = {}
    for r in recs:
        for g in r.get("gate_calls") or []:
            k = tuple(json.dumps(g.get(f)) for f in _GATE_KEY)
            e = gate.setdefault(
                k,
                {
                    **{f: g.get(f) for f in g if f not in ("n", "max_seq_len_min", "max_seq_len_max")},
                    "n": 0,
                    "processes": [],
                },
            )
            e["n"] += g["n"]
            if _proc_label(r) not in e["processes"]:
                e["processes"].append(_proc_label(r))
    return list(gate.values())


def step_gaps(folded: dict[str, Any]) -> list[str]:
    """The recorder's step hook never fired in a process that serves the model (its hook was found
    or not looked for, and it counted 0 steps): step counts, and the per-step counts a per-step
    mode asks for, are missing. Read from a cell row's `routing`, so older rows are judged too."""
    if any("hook 'steps'" in w for w in folded.get("warnings") or []):
        return []  # already said: the hook was not found there
    if any(p.get("error") for p in folded.get("processes") or []):
        return []  # the plugin failed there (patch_problem says so): no step could run
    never = [
        p
        for p in folded.get("processes") or []
        if (p.get("serves_model") or p.get("runs_model")) and p.get("model_steps") == 0
    ]
    if not never:
        return []
    asked = "per-step" in (folded.get("routing_mode") or [])
    versions = " / ".join(sorted({str(p.get("vllm_version")) for p in never if p.get("vllm_version")})) or "unknown"
    return [
        f"the recorder's step hook never fired in {', '.join(p['label'] for p in never)} (vLLM {versions}): "
        "no step counts"
        + ("; the per-step counts asked for (E2E_ROUTING_MODE = per-step) were not delivered" if asked else "")
    ]


def _serves_model(r: dict[str, Any]) -> bool:
    # Records of plugin versions before hook_status lack serves_model: their runs_model stands in.
    return bool(r.get("serves_model") or r.get("runs_model"))


def _versions(recs: list[dict[str, Any]]) -> str:
    vs = sorted({str(r.get("vllm_version")) for r in recs if r.get("vllm_version")})
    return " / ".join(vs) or "unknown"


def serving_processes(record_dir: Path) -> dict[int, str] | None:
    """The live processes of the server writing into record_dir (each carries E2E_RECORD_DIR in its
    environment): pid -> command line head. vLLM's own processes only: the API server and what it
    spawned, not multiprocessing's resource tracker or compile workers, which never load plugins.
    None when the processes cannot be read (then nothing is claimed about them)."""
    want = Path(record_dir).resolve()
    out: dict[int, str] = {}
    try:
        procs = list(psutil.process_iter(["pid", "cmdline"]))
    except psutil.Error:
        return None
    for p in procs:
        try:
            env = p.environ()
        except (psutil.Error, OSError):
            continue
        rd = env.get(ENV_RECORD_DIR)
        if not rd or Path(rd).resolve() != want:
            continue
        cmd = " ".join(p.info.get("cmdline") or [])
        # vLLM retitles its children (VLLM::EngineCore, VLLM::Worker): match without case.
        if "resource_tracker" in cmd or not ("vllm" in cmd.lower() or "spawn_main" in cmd):
            continue
        out[p.info["pid"]] = cmd[:160]
    return out


def hook_table(recs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per essential target of the recorder: the model-serving processes that found it (where) and
    those that did not (why), with the vLLM version each ran."""
    table: dict[str, dict[str, Any]] = {}
    for name in targets.ESSENTIAL:
        row: dict[str, Any] = {"what": targets.WHAT[name], "found": {}, "not_found": {}}
        for r in recs:
            # A process whose plugin failed stopped before vLLM built anything: its error is the
            # story (patch_problem), not the hooks it never reached.
            if not _serves_model(r) or r.get("error") or not isinstance(r.get("hook_status"), dict):
                continue
            st = r["hook_status"].get(name) or {"state": "unknown", "why": "not in the record"}
            label = f"{_proc_label(r)} (vLLM {r.get('vllm_version')})"
            if st.get("state") == targets.FOUND:
                row["found"][label] = st.get("where")
            else:
                row["not_found"][label] = f"{st.get('state')}: {st.get('why')}"
        table[name] = row
    return table


def routing_warnings(recs: list[dict[str, Any]], folded: dict[str, Any], checked_live: bool) -> list[str]:
    """Why this cell's routing is not a result, each naming the vLLM version; [] when it is one."""
    v = _versions(recs)
    out = []
    if not recs:
        out.append(
            f"no routing records from any process of this server (vLLM {v}): the plugin did not "
            f"load or could not write; routing unknown"
        )
    for p in folded.get("unrecorded_processes") or []:
        out.append(
            f"vLLM {v}: live server process pid {p['pid']} wrote no routing record "
            f"({p['cmdline'][:80]}): the plugin did not load there"
        )
    if not recs:
        return out
    servers = [r for r in recs if _serves_model(r)]
    if not servers:
        out.append(
            f"vLLM {v}: no record from a process that serves the model "
            f"({', '.join(_proc_label(r) for r in recs)} reported); routing unknown"
        )
    for name, row in (folded.get("hooks") or {}).items():
        for label, why in row["not_found"].items():
            out.append(f"hook {name!r} ({row['what']}) not found in {label}: {why}")
    for r in servers:
        steps = (r.get("hook_status") or {}).get(targets.STEPS.name) or {}
        forwards = sum(c.get("n", 0) for c in r.get("counts") or [] if str(c.get("path")).startswith("forward:"))
        if steps.get("state") == targets.FOUND and forwards and not r.get("model_steps"):
            # Hooked, yet attention ran and no step ended: this release steps through another method.
            out.append(
                f"hook {targets.STEPS.name!r} ({targets.STEPS.what}) found in {_proc_label(r)} "
                f"(vLLM {r.get('vllm_version')}) at {steps.get('where')} but never fired while "
                f"{forwards} attention forwards ran: per-step counts missing"
            )
        for k in ("config_error", "rank_error", "flush_error"):
            if r.get(k):
                out.append(f"vLLM {r.get('vllm_version')}: {_proc_label(r)}: {k} {r[k]}")
        if r.get("_stale"):
            out.append(
                f"vLLM {r.get('vllm_version')}: {_proc_label(r)}: record not refreshed before the "
                f"fold (process hung or gone): counts may be short"
            )
    if servers and not out and not folded.get("layer_classes") and not any(r.get("error") for r in recs):
        out.append(
            f"vLLM {v}: hooks found but no attention layer class counted (no forward ran with attention metadata)"
        )
    return out


def decisive_path(paths: dict[str, int]) -> str | None:
    """The kernel path a layer class took: the paged-attention kernels when the ROCm dispatch ran,
    else the attention implementation's forward. Several at once are joined with '+'."""
    kernels = [p for p in ("rocm_custom_op", "triton_paged_attention_2d") if paths.get(p)]
    if kernels:
        return "+".join(kernels)
    fwd = sorted(p for p in paths if p.startswith("forward:") and paths[p])
    return "+".join(fwd) or None


def patch_problem(routing: dict[str, Any], arm: ArmCfg) -> str | None:
    """Why the cell cannot be trusted to have run the arm (its patches, in every process), or None.

    Every process that loaded the plugin must have applied all of the arm's patches; a process
    whose plugin failed is always a problem. With patches, at least one model-running process
    must have reported, and the model-running ranks must cover the tensor-parallel size they report.
    """
    procs = routing.get("processes") or []
    errors = [f"{p['label']}: {p['error']}" for p in procs if p.get("error")]
    if errors:
        return "plugin failed in " + "; ".join(errors)
    if not arm.patches:
        return None
    want = list(arm.patches)
    if not procs:
        return f"no plugin records arrived: patches {want} not proven applied"
    missing = [p["label"] for p in procs if not set(want) <= set(p.get("patches_applied") or [])]
    missing += [f"pid {p['pid']} (no record)" for p in routing.get("unrecorded_processes") or []]
    if missing:
        return f"patches {want} not applied in {', '.join(missing)}"
    runners = [p for p in procs if p.get("runs_model") or p.get("serves_model")]
    if not runners:
        return f"patches {want}: no record from a process that runs the model (worker)"
    size = max((p.get("tp_size") or 1) for p in runners)
    ranks = {p.get("rank") for p in runners}
    if len(ranks) < size:
        return f"patches {want}: records from ranks {sorted(ranks, key=str)} of tensor-parallel size {size}"
    return None


def routing_summary(routing: dict[str, Any]) -> list[str]:
    """A few lines for a person: processes and patches, then each layer class's path and counts."""
    procs = routing.get("processes") or []
    lines = [
        f"arm {routing.get('arm')}: {len(procs)} processes "
        f"({', '.join(p['label'] for p in procs)}); patches {routing.get('patches')}; "
        f"graphs {routing.get('cudagraph_modes')}"
    ]
    for p in procs:
        if p.get("error") or (routing.get("patches") and set(routing["patches"]) - set(p.get("patches_applied") or [])):
            lines.append(f"  ! {p['label']}: applied {p.get('patches_applied')} error {p.get('error')}")
    for w in routing.get("warnings") or []:
        lines.append(f"  ! routing: {w}")
    for c in routing.get("layer_classes") or []:
        counts = ", ".join(f"{k}={v}" for k, v in sorted(c["paths"].items()))
        lines.append(f"  {c['layer_class']} x{c['n_layers']}: {c['path']} [{counts}] in {len(c['processes'])} proc")
    for g in routing.get("gate") or []:
        lines.append(
            f"  gate gqa={g.get('gqa_ratio')} head={g.get('head_size')} block={g.get('block_size')} "
            f"window={g.get('sliding_window')} -> {g.get('answer')} x{g['n']} in {len(g['processes'])} proc"
        )
    return lines
