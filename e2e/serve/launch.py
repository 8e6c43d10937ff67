"""From a config and an arm to a server of a run (`start_server`, the one way every server of a run
is built): the ServerSpec (argv and environment), the per-arm compile cache, the plugin's
environment, the API key, the server's tag and its live record.

The plugin's environment is e2e/plugin/contract.py's E2E_* variables, plus
    PYTHONPATH    prepended with a generated entry-point shim and the project root, so the plugin
                  loads in any interpreter (another venv, a pip --target install) without installing
                  the project there; the existing PYTHONPATH is kept.
    VLLM_PLUGINS  if set (an allow-list), e2e_arms is added to it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import secrets
import shutil
import stat
import sys
import tempfile
from pathlib import Path
from typing import Protocol

from e2e.design.config import ArmCfg, Config, max_num_seqs_args
from e2e.errors import UserError
from e2e.plugin import contract as pc
from e2e.serve import live_servers
from e2e.serve.server import ServerSpec, VllmServer

PROJECT_ROOT = Path(__file__).resolve().parents[2]  # e2e/serve/launch.py -> the checkout


def shim_dir(root: Path = PROJECT_ROOT) -> Path:
    """A folder holding only `<dist>.dist-info/` that declares the plugin's entry point.

    Generated (idempotently) under the temp dir, keyed by the project root, so a clean clone needs
    no install step and nothing is written into the checkout. Every server loads what is in it, so
    it is private: created 0700, and an existing one that is a symlink, not ours, or writable by
    group or others is refused (another user could have planted a plugin there).
    """
    tag = hashlib.sha256(f"{root}\n{pc.ENTRY_POINT}".encode()).hexdigest()[:12]
    base = Path(tempfile.gettempdir()) / f"vllm-e2e-bench-shim-{os.getuid()}-{tag}"
    info = base / f"{pc.SHIM_DIST}-0+shim.dist-info"
    eps = f"[vllm.general_plugins]\n{pc.ENTRY_POINT}\n"
    meta = f"Metadata-Version: 2.1\nName: {pc.SHIM_DIST}\nVersion: 0+shim\nSummary: plugin shim for {root}\n"
    _private_dir(base)
    if (info / "entry_points.txt").is_file() and (info / "entry_points.txt").read_text() == eps:
        return base
    tmp = Path(tempfile.mkdtemp(prefix=info.name + ".", dir=base))
    (tmp / "METADATA").write_text(meta)
    (tmp / "entry_points.txt").write_text(eps)
    try:
        os.replace(tmp, info)
    except OSError:  # another process made it first
        for f in tmp.iterdir():
            f.unlink()
        tmp.rmdir()
    return base


def _private_dir(p: Path) -> None:
    """p exists, is a real folder owned by this user and writable by nobody else."""
    try:
        os.mkdir(p, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise UserError(f"cannot create the plugin shim folder {p}: {exc.strerror}") from None
    st = os.lstat(p)
    why = (
        "is not a folder (a symlink?)"
        if not stat.S_ISDIR(st.st_mode)
        else f"is owned by uid {st.st_uid}, not {os.getuid()}"
        if st.st_uid != os.getuid()
        else f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        else None
    )
    if why:
        raise UserError(
            f"plugin shim folder {p} {why}: refusing to load a plugin from it; remove it (it is rebuilt private)"
        )


def server_python(cfg: Config, arm: ArmCfg) -> str:
    return arm.python or cfg.server.python or sys.executable


def check_launchable(cfg: Config, arm_names: list[str] | None = None) -> None:
    """Before a run folder exists: every interpreter a server would run is there and executable,
    and the plugin shim folder is private."""
    for a in cfg.arms:
        if arm_names is not None and a.name not in arm_names:
            continue
        py = server_python(cfg, a)
        if shutil.which(py) is None:
            where = f"arms.{a.name}.python" if a.python else "server.python"
            exists = shutil.which(py, mode=os.F_OK) is not None
            raise UserError(f"{where}: {py} {'is not executable' if exists else 'does not exist'}")
    shim_dir()


def plugin_env(arm: ArmCfg, record_dir: Path, cfg: Config) -> dict[str, str]:
    """Environment that switches the plugin on for this arm's server (merged over the arm's env)."""
    base = {**os.environ, **cfg.server.env, **arm.env}
    mode = base.get(pc.ENV_ROUTING_MODE, pc.DEFAULT_ROUTING_MODE) or pc.DEFAULT_ROUTING_MODE
    if mode not in pc.ROUTING_MODES:
        raise UserError(f"arm {arm.name}: {pc.ENV_ROUTING_MODE}={mode!r}: use one of {', '.join(pc.ROUTING_MODES)}")
    paths = [str(shim_dir()), str(PROJECT_ROOT)]
    old = base.get("PYTHONPATH", "")
    paths += [p for p in old.split(os.pathsep) if p and p not in paths]
    env = {
        pc.ENV_ON: "1",
        pc.ENV_ARM: arm.name,
        pc.ENV_PATCHES: ",".join(arm.patches),
        pc.ENV_RECORD_DIR: str(record_dir),
        pc.ENV_ROUTING_MODE: mode,
        "PYTHONPATH": os.pathsep.join(paths),
    }
    allow = base.get("VLLM_PLUGINS")
    if allow is not None and pc.PLUGIN_NAME not in allow.split(","):
        env["VLLM_PLUGINS"] = ",".join([p for p in allow.split(",") if p] + [pc.PLUGIN_NAME])
    return env


@functools.lru_cache(maxsize=1)
def session_api_key() -> str:
    """One random API key for every server this harness process starts.

    vLLM 0.26 hashes every VLLM_* variable it knows, VLLM_API_KEY included, into its torch.compile
    cache key, so a fresh key per server gave every start of an arm its own cache folder and each
    compiled from scratch. One key per harness process keeps the cache warm across an arm's starts
    and still proves the server on a port is ours (/v1/models with the key). It lives only in the
    servers' environment and lm-eval's, never in argv, a log or the run folder.
    """
    return secrets.token_hex(16)


def compile_cache_env(cfg: Config, arm: ArmCfg, run_root: Path) -> dict[str, str]:
    """One vLLM cache root per arm and interpreter: an arm's later cells reuse its compiled graphs
    (cheaper starts), but no arm ever loads what another arm compiled."""
    if cfg.server.compile_cache != "per-arm":
        return {}
    python = server_python(cfg, arm)
    tag = hashlib.sha256(python.encode()).hexdigest()[:8]
    return {"VLLM_CACHE_ROOT": str(Path(run_root).resolve() / "vllm-cache" / f"{arm.name}-{tag}")}


def server_spec(cfg: Config, arm: ArmCfg, record_dir: Path | None, run_root: Path | None = None) -> ServerSpec:
    s = cfg.server
    env = {**(compile_cache_env(cfg, arm, run_root) if run_root else {}), **s.env, **arm.env}
    if record_dir is not None:
        env.update(plugin_env(arm, record_dir, cfg))
    return ServerSpec(
        python=server_python(cfg, arm),
        model=cfg.model.path,
        tokenizer=cfg.model.tokenizer,
        tensor_parallel_size=s.tensor_parallel_size,
        max_model_len=cfg.model.max_model_len,
        cuda_graphs=s.cuda_graphs,
        compilation_config=s.compilation_config,
        gpu_memory_utilization=s.gpu_memory_utilization,
        launcher=s.launcher,
        extra_args=tuple(s.extra_args) + tuple(arm.args),
        env=env,
        prefix_caching=cfg.workload.route == "primed",
        # at least the largest c running; a --max-num-seqs of the config's own wins (it is >= c: config check)
        max_num_seqs=c if (c := cfg.workload.max_concurrency) > 1 and not max_num_seqs_args(cfg) else None,
    )


class RunRoot(Protocol):
    """A run folder as its servers see it: a Path, or on a Ray node its scratch folder, whose
    resolve() names the driver's run folder (e2e/run/executors/node_side.py NodeRoot)."""

    def __fspath__(self) -> str: ...

    def resolve(self) -> object: ...


def start_server(
    cfg: Config, arm: ArmCfg, run_root: RunRoot, key: str, record_dir: Path, log: Path, profile_dir: Path | None = None
) -> VllmServer:
    """A server of the run at run_root, not started yet (on_fresh_servers enters it): the arm's
    spec with its per-arm compile cache under the run folder, the plugin recording to record_dir,
    the harness's one API key, E2E_SERVER_TAG = <run folder>::<key> and E2E_SERVER_RUN = its digest
    in every process's environment (orphan and leak checks find a run's servers by them), and its record in <run>/live-servers/
    while it runs. Both the run loop's servers and the gsm8k step's are built here. With profile_dir,
    vLLM's torch profiler is configured to write there (e2e/serve/profiler_args.py)."""
    spec = server_spec(cfg, arm, record_dir, Path(run_root))
    if profile_dir is not None:
        from e2e.serve import profiler_args as server_args

        spec = server_args.with_profiler(spec, profile_dir.resolve(), server_args.release_of(spec.python))
    spec.env.update(live_servers.run_marks(str(run_root.resolve()), key))
    return VllmServer(
        spec,
        log,
        cfg.server.startup_timeout_s,
        cfg.server.stop_timeout_s,
        api_key=session_api_key(),
        live_dir=Path(run_root) / live_servers.LIVE_DIR,
    )
