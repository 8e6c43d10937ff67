"""What a run would refuse, checked before its first server, every problem at once (one line each).

`check` is the one function both `run --dry-run` (e2e/cli/plan_view.py prints what it found) and
the run itself (session.start and session.resume, through `require`) call, so the two never disagree:

    interpreters  each arm's exists, is executable and runs (e2e/run/arm_probe.py)
    patches       each module:function imports and has its function in its arm's interpreter, and
                  every function it declares it wraps exists there; a built-in's target is in that
                  interpreter's vLLM; and whether each arm can be caught inert (patch_evidence)
    model         a local model folder prompts can be drawn for (its config.json), or model.vocab_size
    ROCm backend  for a Gemma 3, what each arm's vLLM would serve it with on ROCm and whether that asks
                  the gate (e2e/plugin/targets.py predict_rocm_backend): shown, never refused
    gsm8k         when the sign-off will run: its arms, tasks, lm-eval (the `gsm8k` extra), test split
    GPU state     under --gpu-exclusive fail, that this machine's GPUs can be read (e2e/gpu/gpu_probe.py;
                  a local run: Ray's nodes check their own, e2e/gpu/gpu_state.py preflight)

What only a running server can show (a start that fails, a patch failing in a worker) is not here.
"""

from __future__ import annotations

import json
import os
import shlex
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from e2e.accuracy import gsm8k_step
from e2e.accuracy.tasks import FULL_SIZE
from e2e.accuracy.unit import plan_units
from e2e.design.config import ArmCfg, Config
from e2e.errors import UserError
from e2e.plugin import targets
from e2e.plugin.contract import ENV_ROUTING_MODE
from e2e.run.arm_probe import ArmProbe, probe_arm
from e2e.run.measure import TokenSampler
from e2e.rundir import patch_evidence
from e2e.safety.redact import redact_args, redact_env
from e2e.serve.launch import check_launchable, server_python, server_spec

PORT = "PORT"  # a free port, chosen when the server starts


@dataclass(frozen=True)
class ArmFacts:
    """What an arm's servers run, secrets redacted: env is the config's (server.env, then the
    arm's); the harness adds its own (the plugin's, the API key, the compile cache)."""

    name: str
    python: str
    vllm: str
    patches: tuple[str, ...]
    env: dict[str, str]
    argv: str
    inert_check: str = ""  # whether the run can tell this arm's patch changed nothing (patch_evidence)
    rocm: str | None = None  # what its vLLM serves a Gemma 3 with on ROCm (None: not a Gemma 3, vLLM unknown)


@dataclass(frozen=True)
class Gsm8kStep:
    """The sign-off after the cells: every question of every task on one fresh server per unit."""

    tasks: tuple[str, ...]
    questions: int  # per task and arm
    servers: int
    aa: str | None


@dataclass
class Preflight:
    arms: list[ArmFacts] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    sampler: TokenSampler | None = None  # None when the model is a problem
    gsm8k: Gsm8kStep | None = None  # None: no sign-off after the cells (off, or a problem)
    gsm8k_off: str | None = None  # why it is off

    def refuse(self) -> None:
        """UserError when anything is wrong: one `error:` line per problem (e2e/exits.py prints the first prefix)."""
        if self.problems:
            raise UserError("\nerror: ".join(self.problems))


def check(
    cfg: Config, gsm8k: bool = True, gsm8k_limit: int | None = None, gsm8k_aa: str | None = None, local: bool = True
) -> Preflight:
    """Everything above, for `cfg` as the run would run it (gsm8k: unless --no-gsm8k; local: the
    cells run on this machine, not on Ray's nodes)."""
    out = Preflight()
    if local and cfg.run.gpu_exclusive == "fail":
        blind = _unreadable_gpu(cfg)
        if blind:
            out.problems.append(blind)
    try:
        out.sampler = TokenSampler.for_model(cfg.model.path, cfg.workload.seed, cfg.model.vocab_size)
    except UserError as exc:
        out.problems.append(str(exc))
    except (OSError, ValueError) as exc:  # a config.json or tokenizer.json that cannot be read
        out.problems.append(f"model.path {cfg.model.path!r}: its config.json or tokenizer.json is unreadable: {exc}")
    with ThreadPoolExecutor(max_workers=len(cfg.arms)) as pool:
        probes = list(pool.map(lambda a: _arm(cfg, a), cfg.arms))
    arch = _architecture(cfg.model.path)
    for arm, probe in zip(cfg.arms, probes, strict=True):
        out.problems += probe.problems
        out.arms.append(_facts(cfg, arm, probe, arch))
    out.gsm8k_off = None if cfg.gsm8k.enabled and gsm8k else "gsm8k.enabled = false" if gsm8k else "--no-gsm8k"
    if out.gsm8k_off is None:
        try:
            limit = gsm8k_step.preflight(cfg, [a.name for a in cfg.arms], gsm8k_limit, gsm8k_aa)
            units = plan_units([a.name for a in cfg.arms], gsm8k_aa)
            out.gsm8k = Gsm8kStep(cfg.gsm8k.tasks, min(limit or FULL_SIZE, FULL_SIZE), len(units), gsm8k_aa)
        except UserError as exc:
            out.problems.append(str(exc))
    out.problems = list(dict.fromkeys(out.problems))  # a shared server.python is one problem, not one per arm
    return out


def require(
    cfg: Config, gsm8k: bool = True, gsm8k_limit: int | None = None, gsm8k_aa: str | None = None, local: bool = True
) -> Preflight:
    """check(), refused (UserError, every problem) unless nothing is wrong: the run's first step."""
    found = check(cfg, gsm8k, gsm8k_limit, gsm8k_aa, local)
    found.refuse()
    return found


def _unreadable_gpu(cfg: Config) -> str | None:
    """--gpu-exclusive fail where no GPU can be read: the policy could act on nothing, so the run is
    refused before a run folder exists (the line names each reader tried)."""
    from e2e.gpu.gpu_state import GpuProbe

    probe = GpuProbe.open({**os.environ, **cfg.server.env}, cfg.server.tensor_parallel_size)
    try:
        if probe.available:
            return None
        return (
            f"GPU state cannot be read ({probe.reason}): --gpu-exclusive fail cannot see another process "
            "on the GPU; refusing to start (--gpu-exclusive warn runs without it)"
        )
    finally:
        probe.close()


def _arm(cfg: Config, arm: ArmCfg) -> ArmProbe:
    try:
        check_launchable(cfg, [arm.name])  # exists and is executable
        return probe_arm(cfg, arm)
    except UserError as exc:
        return ArmProbe(server_python(cfg, arm), problems=[str(exc)])


def _architecture(model_path: str) -> str | None:
    """The first of the local model folder's config.json architectures (None: a hub name, unreadable)."""
    try:
        archs = json.loads((Path(model_path) / "config.json").read_text()).get("architectures") or [None]
    except (OSError, ValueError, AttributeError):
        return None
    return archs[0] if isinstance(archs[0], str) else None


def _rocm_line(arch: str | None, vllm: str, args: list[str]) -> str | None:
    if arch not in (targets.GEMMA3_MM, targets.GEMMA3_TEXT) or targets.release(vllm) is None:
        return None
    p = targets.predict_rocm_backend(vllm, arch, args)
    if p is None:
        first, last = (".".join(map(str, v)) for v in (min(targets.ROCM_RELEASES), max(targets.ROCM_RELEASES)))
        return f"on ROCm gfx11: no prediction for {vllm} (the releases read are {first} to {last})"
    return p.line()


def _facts(cfg: Config, arm: ArmCfg, probe: ArmProbe, arch: str | None = None) -> ArmFacts:
    spec = server_spec(cfg, arm, None)
    argv = spec.argv(0)
    argv[argv.index("--port") + 1] = PORT
    off = {**cfg.server.env, **arm.env}.get(ENV_ROUTING_MODE) == "off"
    check = patch_evidence.check_line(arm.name == cfg.arms[0].name, arm.patches, probe.wraps, off)
    return ArmFacts(
        arm.name,
        probe.python,
        probe.vllm,
        arm.patches,
        redact_env(spec.env),
        shlex.join(redact_args(argv)),
        check,
        _rocm_line(arch, probe.vllm, [*cfg.server.extra_args, *arm.args]),
    )
