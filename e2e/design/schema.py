"""The config's schema: frozen pydantic models of every section, their bounds, and the checks that
cross sections (arm names, run order, harness-owned flags (e2e/design/harness_flags.py), the model's context).

A config names a model, how to serve it, the workload (depths, token counts, rounds) and the arms.
An arm is a named set of environment variables, extra `vllm serve` arguments, plugin patches, and
optionally another Python interpreter (another vLLM installation). Reading a TOML file into these,
overrides and one-line errors live in e2e/design/config.py.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from e2e.design.defaults import ALPHA, DEFAULT_PASSES, ESTIMATOR, MIN_EFFECT_PCT
from e2e.design.harness_flags import harness_flag
from e2e.design.point import Point
from e2e.errors import UserError
from e2e.plugin.contract import patch_form_problem

# An arm name, a run id: a plain name, never a path (used as folder and file names).
PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
ARM_NAME = PLAIN_NAME

# Bounds that keep a value from passing validation and failing once a run folder exists.
# Token counts: prompts are built in memory, and no served model has a context near 2**24 tokens.
MAX_TOKENS = 2**24
MAX_VOCAB = 2**24  # the sampler holds every token id (the largest vocabularies are ~2**18)
MAX_PASSES = 1000  # the plan holds every cell before anything starts
MAX_CONCURRENCY = 1024  # one thread and one connection per request of a round
# The decision rule: an alpha of 0.5 or more is no test; a min effect above 50 % calls a 2x
# slowdown "equivalent". compare and history read them from a manifest with the same bounds.
Alpha = Annotated[float, Field(gt=0, lt=0.5)]
MinEffectPct = Annotated[float, Field(gt=0, le=50)]
Tokens = Annotated[StrictInt, Field(le=MAX_TOKENS)]


def _env_names(env: dict[str, str]) -> dict[str, str]:
    """Names a process environment can hold (os.environ and execve refuse these)."""
    for k in env:
        if not k:
            raise ValueError("variable name '' is empty")
        if "=" in k:
            raise ValueError(f"variable name {k!r} holds '='")
    return env


def _bad_text(x: str) -> str | None:
    if "\x00" in x:
        return "holds a NUL byte"
    try:
        x.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid text (a lone surrogate)"
    return None


def text_problem(data: Any, path: str = "") -> str | None:
    """The first string, key or value, that no process can take: a NUL byte ends it in C (argv,
    env, paths); a lone surrogate (possible in a manifest's JSON) cannot be encoded."""
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, (list, tuple)) else ()
    for k, v in items:
        name = k if isinstance(k, str) and k.isprintable() else repr(k)  # the message stays one line
        where = f"{path}.{name}" if path else name
        why = _bad_text(k) if isinstance(k, str) else None
        if why:
            return f"{path or 'config'}: key {k!r} {why}"
        why = _bad_text(v) if isinstance(v, str) else text_problem(v, where)
        if why:
            return f"{where}: {why}" if isinstance(v, str) else why
    return None


def is_plain_name(s: str) -> bool:
    return bool(PLAIN_NAME.fullmatch(s)) and ".." not in s


class _Frozen(BaseModel):
    # NaN and infinity pass every bound (or stand for "never"): a finite number or an error.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ModelCfg(_Frozen):
    path: str = Field(min_length=1, description="local folder or hub name")
    tokenizer: str | None = None
    max_model_len: StrictInt | None = Field(default=None, gt=0, le=MAX_TOKENS)
    # Context length of the model itself, when the config cannot be read (hub names);
    # used to reject depth + long_tokens beyond it before anything starts.
    context_len: StrictInt | None = Field(default=None, gt=0, le=MAX_TOKENS)
    # Token ids for random prompts come from the local folder's tokenizer; set this for a hub name.
    vocab_size: StrictInt | None = Field(default=None, gt=100, le=MAX_VOCAB)
    twin_of: str | None = None  # set for random-weight twins: reports must never call it the real model


class ServerCfg(_Frozen):
    python: str | None = None  # default: the interpreter running the harness
    launcher: Literal["api_server", "cli"] = "api_server"
    tensor_parallel_size: StrictInt = Field(default=1, ge=1)
    cuda_graphs: bool = True
    compilation_config: str | None = None  # passed as -cc JSON when set
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = {}
    startup_timeout_s: float = Field(default=900.0, gt=0)
    request_timeout_s: float = Field(default=600.0, gt=0)
    stop_timeout_s: float = Field(default=30.0, gt=0)
    # "fresh": one server per cell (default; server instances differ).
    # "per-arm-pass": one server for all depths of an arm within a pass (fewer starts).
    mode: Literal["fresh", "per-arm-pass"] = "fresh"
    # vLLM's compile cache (VLLM_CACHE_ROOT): "per-arm" = one per arm and interpreter inside the run
    # folder, reused by that arm's later cells, never shared across arms (a patch can change what is
    # compiled); "vllm-default" = whatever the environment says (shared by every arm).
    compile_cache: Literal["per-arm", "vllm-default"] = "per-arm"
    # The escape hatch for args that set what the harness owns (HARNESS_FLAGS): recorded in the
    # manifest (harness_flag_overrides) and stated at the top of report.md.
    allow_harness_flag_overrides: bool = False

    @field_validator("env")
    @classmethod
    def _env_ok(cls, v: dict[str, str]) -> dict[str, str]:
        return _env_names(v)


class WorkloadCfg(_Frozen):
    depths: tuple[Tokens, ...] = Field(min_length=1)  # strict: `depths = [true]` is not 1
    long_tokens: Tokens = Field(default=64, gt=1)
    short_tokens: Tokens = Field(default=8, gt=0)
    rounds: StrictInt = Field(default=10, ge=1)
    warmup_rounds: StrictInt = Field(default=1, ge=0)
    seed: StrictInt = Field(default=0, ge=0)  # numpy's generator takes no negative seed
    # Adaptive precision (stats issue): keep measuring until CI half-width < target_ci_pct.
    target_ci_pct: float | None = Field(default=None, gt=0)
    max_rounds: StrictInt = Field(default=50, ge=1)
    # Closing rounds of each server's first depth at the end of its life (e2e/stats/bookends.py); 0: none.
    # Run only where the test can reject (opening rounds x these reach p < stats.bookend_alpha).
    bookend_rounds: StrictInt = Field(default=5, ge=0)
    # Requests that decode together in a round (the batch), one or more values: the run measures
    # every depth at every c, and each (depth, c) is a design point (e2e/design/point.py) with its own
    # verdicts. [1]: today's design, one request at a time over fresh prompts with prefix caching off.
    # Any c above 1: the primed route at every point (e2e/run/batch.py): the servers run with prefix
    # caching on, a cell's c prompts are prefilled once and reused, so every timed decode step runs
    # the c requests together. One route per run, so every arm and point is timed the same way.
    concurrency: tuple[StrictInt, ...] = Field(default=(1,), min_length=1)

    @field_validator("concurrency", mode="before")
    @classmethod
    def _as_tuple(cls, v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool):
            return (v,)
        return v

    @field_validator("concurrency")
    @classmethod
    def _concurrency_in_range(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        for c in v:
            if not 1 <= c <= MAX_CONCURRENCY:
                raise ValueError(f"concurrency {c} must be from 1 to {MAX_CONCURRENCY}")
        if len(set(v)) != len(v):
            raise ValueError(f"concurrency {list(v)} names a value twice")
        return tuple(sorted(v))

    @property
    def max_concurrency(self) -> int:
        """The largest c: what a server must run together (--max-num-seqs)."""
        return max(self.concurrency)

    @property
    def points(self) -> list[Point]:
        """Every (depth, c) the run measures, in the run's order (by c, then depth)."""
        return sorted(Point(d, c) for d in self.depths for c in self.concurrency)

    @property
    def route(self) -> str:
        """How decode is isolated: "fresh" prompts when every c is 1, "primed" prompts otherwise
        (e2e/run/batch.py), at every point of the run."""
        return "fresh" if self.max_concurrency == 1 else "primed"

    @field_validator("depths")
    @classmethod
    def _depths_positive_unique(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        for d in v:
            if d <= 0:
                raise ValueError(f"depth {d} must be a positive number of tokens")
        if len(set(v)) != len(v):
            raise ValueError("depths repeat")
        return tuple(sorted(v))

    @model_validator(mode="after")
    def _long_exceeds_short(self) -> WorkloadCfg:
        if self.long_tokens <= self.short_tokens:
            raise ValueError(f"long_tokens ({self.long_tokens}) must exceed short_tokens ({self.short_tokens})")
        return self


class RunCfg(_Frozen):
    order: str = "stock-first"
    # Passes alternate which arm leads; each pass is one server per arm (per cell in fresh mode).
    passes: StrictInt | None = Field(default=None, ge=1, le=MAX_PASSES)  # None: DEFAULT_PASSES
    # Adaptive replication: add passes until every pooled arm-ratio interval is narrower than
    # +-target_ci_pct % (or max_passes / max_minutes is reached); None: the planned passes only.
    target_ci_pct: float | None = Field(default=None, gt=0)
    max_passes: StrictInt = Field(default=12, ge=2, le=MAX_PASSES)
    max_minutes: float | None = Field(default=None, gt=0)
    out: str = "results"
    fail_fast: bool = False
    retries: StrictInt = Field(default=1, ge=0, le=100)  # fresh-server retries of a cell whose server failed
    # A process on a cell's GPU that is not its server (e2e/gpu/gpu_state.py): measure the cell again on a
    # fresh server (within `retries`), count it and mark it, or stop the run.
    gpu_exclusive: Literal["retry", "warn", "fail"] = "retry"


class ArmCfg(_Frozen):
    name: str
    env: dict[str, str] = {}
    args: tuple[str, ...] = ()
    patches: tuple[str, ...] = ()
    python: str | None = None  # another interpreter = another vLLM installation
    description: str = ""
    # false: this arm's servers start without vLLM's profiler configured and no cell of it is profiled
    # (an arm and its twin differing only here are the A/A that measures the profiler's own effect)
    profile: bool = True

    @field_validator("env")
    @classmethod
    def _env_ok(cls, v: dict[str, str]) -> dict[str, str]:
        return _env_names(v)

    @field_validator("name")
    @classmethod
    def _name_form(cls, v: str) -> str:
        if not is_plain_name(v):
            raise ValueError(f"arm name {v!r} must be letters, digits, '_', '.', '-'")
        return v

    @field_validator("patches")
    @classmethod
    def _patch_form(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for p in v:
            problem = patch_form_problem(p)
            if problem:
                raise ValueError(problem)
        return v


class Gsm8kCfg(_Frozen):
    enabled: bool = True
    tasks: tuple[str, ...] = ("gsm8k_cot_offline",)
    limit: StrictInt | None = Field(default=None, gt=0)
    num_concurrent: StrictInt = Field(default=8, ge=1)
    chat: bool = False
    max_gen_toks: StrictInt = Field(default=256, gt=0)
    max_accuracy_drop: float = Field(default=0.01, ge=0, lt=1)  # verdict bound, absolute fraction
    alpha: Alpha = 0.05


class StatsCfg(_Frozen):
    min_effect_pct: MinEffectPct = MIN_EFFECT_PCT
    alpha: Alpha = ALPHA
    # Which per-request time is differenced (e2e/stats/estimate.py): "auto" = the client's wall time minus
    # the server's own prefill time where every row has it and the check against the plain client
    # estimate passes, else the plain client estimate (with a warning); "client" = always the plain one.
    estimator: Literal["auto", "client"] = ESTIMATOR
    # The MDE the planning figures aim at ("servers per arm for an MDE <= X %"); None: 2 x min_effect.
    target_mde_pct: float | None = Field(default=None, gt=0, le=100)
    # The run-to-run sd (%) compare (run A's) and history assume where one run stands for a release;
    # None: the stated prior (e2e/analysis/run_prior.py). --run-sd / --run-prior override it.
    run_sd_pct: float | None = Field(default=None, ge=0, le=100)
    gpu_bandwidth_gbps: float | None = Field(default=None, gt=0)
    # Measure the GPU's achieved read bandwidth once per run (a few seconds, e2e/gpu/bandwidth.py).
    measure_bandwidth: bool = True
    # Bookends (e2e/stats/bookends.py): a server is non-stationary when its closing rounds differ from its
    # opening ones at this level AND by at least this much.
    bookend_alpha: float = Field(default=0.01, gt=0, lt=1)
    bookend_min_step_pct: float = Field(default=1.0, ge=0)


class ProfileCfg(_Frozen):
    """Kernel profiles (docs/concepts/profile.md): after each server's timed and bookend rounds, one
    untimed profiled round of the long and one of the short request per cell, through vLLM's profiler."""

    enabled: bool = True
    trace: Literal["none", "gz"] = "none"  # keep the raw traces (gzipped) in the run folder, or only the summary
    trace_cap_mib: float = Field(default=64.0, gt=0)  # a cell's traces above this are not kept (the summary is)


class Config(_Frozen):
    name: str = "run"
    description: str = ""
    model: ModelCfg
    server: ServerCfg = ServerCfg()
    workload: WorkloadCfg
    run: RunCfg = RunCfg()
    arms: tuple[ArmCfg, ...] = Field(min_length=1)
    gsm8k: Gsm8kCfg = Gsm8kCfg()
    stats: StatsCfg = StatsCfg()
    profile: ProfileCfg = ProfileCfg()

    @model_validator(mode="before")
    @classmethod
    def _text(cls, data: Any) -> Any:
        problem = text_problem(data) if isinstance(data, dict) else None
        if problem:
            raise ValueError(problem)
        return data

    @model_validator(mode="after")
    def _cross_checks(self) -> Config:
        names = [a.name for a in self.arms]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"arms: name {dup[0]!r} is used twice")
        order_arms(self.run.order, names)  # raises on an order naming no arm
        owned = harness_flag_overrides(self)
        if owned and not self.server.allow_harness_flag_overrides:
            where, arg, flag = owned[0]
            raise ValueError(
                f"{where}: {arg!r} sets {flag}, which the harness owns (loopback bind, "
                "free port, its own API key and served name, prefix caching off); "
                "remove it or set server.allow_harness_flag_overrides = true"
            )
        c = self.workload.max_concurrency
        for where, n in max_num_seqs_args(self):
            if n < c:
                raise ValueError(
                    f"{where}: --max-num-seqs {n} is below workload.concurrency {c}: the {c} requests "
                    "of a round could never decode together"
                )
        limit = self.model.max_model_len or self.model.context_len
        if limit is not None:
            for d in self.workload.depths:
                if d + self.workload.long_tokens > limit:
                    raise ValueError(
                        f"workload.depths: {d} + long_tokens {self.workload.long_tokens} exceeds "
                        f"the model context {limit}"
                    )
        return self

    def arm(self, name: str) -> ArmCfg:
        for a in self.arms:
            if a.name == name:
                return a
        raise UserError(f"--arms: no arm named {name!r} (have: {', '.join(a.name for a in self.arms)})")

    def default_passes(self) -> int:
        """Planned passes. Adaptive replication starts from at least 2 (an interval needs them)."""
        n = self.run.passes if self.run.passes is not None else DEFAULT_PASSES
        return max(n, 2) if self.run.target_ci_pct is not None else n


def _server_args(cfg: Config) -> list[tuple[str, tuple[str, ...]]]:
    """(where, args) of every argument list the config passes to a server: the shared, then each arm's."""
    return [("server.extra_args", cfg.server.extra_args)] + [(f"arms.{a.name}.args", a.args) for a in cfg.arms]


def harness_flag_overrides(cfg: Config) -> list[tuple[str, str, str]]:
    """(where, the arg's flag part, the harness flag it sets) for every config arg that overrides
    a harness-owned flag. The flag part only: a value after '=' may be a secret."""
    out = []
    for where, args in _server_args(cfg):
        for arg in args:
            flag = harness_flag(arg)
            if flag:
                out.append((where, arg.split("=", 1)[0], flag))
    return out


def max_num_seqs_args(cfg: Config) -> list[tuple[str, int]]:
    """(where, value) of every --max-num-seqs the config passes to a server."""
    out = []
    for where, args in _server_args(cfg):
        for i, arg in enumerate(args):
            flag, _, value = arg.partition("=")
            if flag == "--max-num-seqs":
                value = value or (args[i + 1] if i + 1 < len(args) else "")
                if value.isdigit():
                    out.append((where, int(value)))
    return out


def capture_sizes(cfg: Config) -> list[int] | None:
    """The CUDA-graph capture sizes the config asks for (`-cc` JSON: cudagraph_capture_sizes), None
    where it leaves them to vLLM (its defaults cover 1-512)."""
    if not cfg.server.cuda_graphs or not cfg.server.compilation_config:
        return None
    try:
        sizes = json.loads(cfg.server.compilation_config).get("cudagraph_capture_sizes")
    except (ValueError, AttributeError):
        return None
    return sorted(int(s) for s in sizes) if isinstance(sizes, list) else None


def batch_warnings(cfg: Config) -> list[str]:
    """What a run at concurrency c > 1 should be told before it starts (never refused)."""
    sizes = capture_sizes(cfg)
    return [
        f"warning: workload.concurrency {c} is not among the CUDA-graph capture sizes {sizes} "
        f"(server.compilation_config): a decode step of {c} requests runs padded to "
        f"the next captured size ({min((s for s in sizes if s > c), default='none: eager')})"
        for c in cfg.workload.concurrency
        if c > 1 and sizes is not None and c not in sizes
    ]


def order_arms(order: str, arm_names: list[str] | tuple[str, ...]) -> list[str]:
    """Arm order of the FIRST pass for an order name.

    `stock-first` / `widened-first` are the reference names and refer to the config's first and
    second arm whatever they are called; `<arm>-first` puts that arm first; `both` starts with the
    config order (later passes alternate). The remaining arms keep config order after the first.
    """
    names = list(arm_names)
    if order == "both":
        return names
    if not order.endswith("-first"):
        raise ValueError(f"run.order {order!r}: use both, stock-first, widened-first or <arm>-first")
    head = order[: -len("-first")]
    if head in names:
        first = head
    elif head == "stock":
        first = names[0]
    elif head == "widened":
        if len(names) < 2:
            raise ValueError("run.order widened-first needs a second arm")
        first = names[1]
    else:
        raise ValueError(f"run.order {order!r} names no arm (have: {', '.join(names)})")
    return [first] + [n for n in names if n != first]
