"""Flag types and the flag groups several subcommands share (e2e/cli/commands/ builds the parser).
A bad value is one line naming its flag (a UserError passes through argparse to cli.main), before a
run folder exists."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from e2e.errors import UserError
from e2e.run.executors.options import KINDS, ExecutorOptions

DEFAULT_CONFIG = "configs/gemma3-27b-it-w4a16-tp2.toml"


def csv_ints(s: str) -> list[int]:
    try:
        return [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None


def number(flag: str, kind: type, least: float, what: str) -> Callable[[str], Any]:
    """An argparse type: a finite `kind` >= least (floats: > least), else one line naming the flag
    (a UserError passes through argparse to cli.main). NaN and inf are refused here, before a run
    folder exists, not by the code that would use them hours later."""

    def parse(text: str) -> Any:
        try:
            v = kind(text)
        except ValueError:
            v = None
        if v is None or not math.isfinite(v) or v < least or (kind is float and v == least):
            raise UserError(f"{flag} {text!r}: give {what}")
        return v

    return parse


def positive_int(flag: str) -> Callable[[str], int]:
    return number(flag, int, 1, "a positive whole number")


def count(flag: str) -> Callable[[str], int]:
    return number(flag, int, 0, "a whole number, 0 or more")


def positive(flag: str) -> Callable[[str], float]:
    return number(flag, float, 0, "a positive finite number")


def add_config_flag(p: argparse.ArgumentParser) -> None:
    # default None, resolved to DEFAULT_CONFIG where used: --resume must see whether it was given
    p.add_argument("--config", help=f"TOML config (default: {DEFAULT_CONFIG})")


def parse_sets(items: list[str]) -> dict[str, Any]:
    """--set KEY=JSON, repeated (twin, assets random): the config fields to override."""
    ov: dict[str, Any] = {}
    for kv in items:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            raise UserError(f"--set {kv!r}: use KEY=JSON")
        try:
            ov[k] = json.loads(v)
        except json.JSONDecodeError:
            raise UserError(f"--set {kv!r}: value is not JSON") from None
    return ov


def add_run_folder_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", help="results root (default from config: results)")
    p.add_argument("--run-id", help="name of the run folder (default: time stamp + config name)")


def add_arms_flag(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--arms", help=f"comma-separated subset of the config's arms, in this order ({what})")


def check_writable_folder(folder: Path, what: str) -> None:
    """One line, before anything is written, when `folder` cannot take a new file."""
    from e2e.safety.safe_io import probe_writable

    try:
        probe_writable(folder)
    except OSError as exc:
        raise UserError(f"{what}: {folder} is not writable: {exc.strerror}") from None


def add_executor_flags(p: argparse.ArgumentParser) -> None:
    """Where the cells run. Not part of a run's config: --resume may pick another executor."""
    p.add_argument(
        "--executor",
        choices=KINDS,
        default="local",
        help="local: one server at a time on this host (default); ray: server groups as Ray "
        "tasks on a cluster's GPUs or nodes (pip install 'vllm-e2e-bench[ray]')",
    )
    p.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="a running Ray cluster (auto, HOST:PORT, ray://HOST:PORT); default: start a local one",
    )
    p.add_argument(
        "--max-per-host",
        type=positive_int("--max-per-host"),
        metavar="N",
        help="ray: at most N cells at once per host (default 1: side by side they share CPUs, PCIe and host memory)",
    )
    p.add_argument(
        "--max-slots",
        type=positive_int("--max-slots"),
        metavar="N",
        help="ray: use at most N slots (GPU sets or nodes)",
    )
    p.add_argument(
        "--slot-balance",
        choices=("warn", "strict"),
        help="ray: when the arms cannot be spread evenly over the slots, warn (default) or refuse",
    )
    p.add_argument(
        "--cpus-per-cell",
        type=positive("--cpus-per-cell"),
        metavar="N",
        help="ray: CPUs a cell asks of Ray (default: its node's CPUs / the node's slots)",
    )


def executor_options(a: argparse.Namespace) -> ExecutorOptions:
    return ExecutorOptions(
        kind=a.executor,
        ray_address=a.ray_address,
        max_per_host=a.max_per_host if a.max_per_host is not None else 1,
        max_slots=a.max_slots,
        balance=a.slot_balance or "warn",
        cpus_per_cell=a.cpus_per_cell,
    )


def _sd_pct(text: str) -> float:
    """--run-sd: a finite % >= 0, else one line naming the flag."""
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and 0 <= v <= 100):
        raise UserError(f"--run-sd {text!r}: give a run-to-run sd in %, from 0 to 100")
    return v


def add_run_sd_args(p: argparse.ArgumentParser) -> None:
    """The run-to-run sd assumed where one run stands for a release (compare; history's two-run splits)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--run-sd",
        type=_sd_pct,
        metavar="PCT",
        help="run-to-run sd assumed at every arm and depth, %% (0: none, servers of two runs taken as "
        "exchangeable; default: the stated prior, docs/statistics/run-to-run.md)",
    )
    g.add_argument(
        "--run-prior", metavar="FILE", help="a JSON prior per depth (the shape of e2e/analysis/run_prior.py)"
    )
