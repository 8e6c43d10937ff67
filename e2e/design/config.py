"""TOML config -> validated, frozen objects; command-line overrides; one-line errors.

The objects themselves (every section's model, its bounds, the cross-section checks) are
e2e/design/schema.py's; the names other stages use are importable from here as well.
"""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from e2e.design.defaults import DEFAULT_PASSES as DEFAULT_PASSES
from e2e.design.schema import Alpha as Alpha
from e2e.design.schema import ArmCfg as ArmCfg
from e2e.design.schema import Config as Config
from e2e.design.schema import MinEffectPct as MinEffectPct
from e2e.design.schema import WorkloadCfg as WorkloadCfg
from e2e.design.schema import batch_warnings as batch_warnings
from e2e.design.schema import harness_flag_overrides as harness_flag_overrides
from e2e.design.schema import is_plain_name as is_plain_name
from e2e.design.schema import max_num_seqs_args as max_num_seqs_args
from e2e.design.schema import order_arms as order_arms
from e2e.errors import UserError
from e2e.safety.redact import redact_config, restore_secrets

CONFIG_MAX_BYTES = 16 << 20  # the largest configs in configs/ are a few KB


def first_error(exc: ValidationError) -> str:
    """The first error of a validation, one line: the dotted field, then what is wrong with it."""
    err = exc.errors()[0]
    # a key is the user's text: one that would break the one line is shown quoted
    loc = ".".join(str(p) if str(p).isprintable() else repr(p) for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif err["type"] == "missing":
        msg = "required field missing"
    elif err["type"] in ("model_type", "model_attributes_type", "dict_type"):
        msg = f"should be a table (an object), not {type(err['input']).__name__}"
    return f"{loc}: {msg}" if loc else msg


def parse_config(data: dict[str, Any], source: str = "config") -> Config:
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise UserError(f"{source}: {first_error(exc)}") from None


def load_config(path: str | Path, overrides: dict[str, Any] | None = None, arms: list[str] | None = None) -> Config:
    """Read a TOML file, keep only `arms` (in that order) when given, and apply overrides given as
    dotted keys ({"run.order": "both"})."""
    p = Path(path)
    try:
        # stat first: reading a FIFO (or /dev/stdin from a pipe) would wait forever, a device never end
        st = os.stat(p)
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"{p}: not a regular file (a FIFO, socket, device or folder): give the config file itself")
        if st.st_size > CONFIG_MAX_BYTES:
            raise UserError(f"{p}: more than {CONFIG_MAX_BYTES} bytes: not a config")
        data = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise UserError(f"config file not found: {p}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{p}: not valid TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{p}: cannot read: {exc}") from None
    if arms is not None:
        data["arms"] = select_arms(data.get("arms", []), arms, str(p))
    for key, value in (overrides or {}).items():
        _set_dotted(data, key, value)
    return parse_config(data, str(p))


def select_arms(data_arms: Any, names: list[str], source: str) -> list[dict[str, Any]]:
    """The named arms of a config's [[arms]] tables, in the order given."""
    if not isinstance(data_arms, list) or not all(isinstance(a, dict) for a in data_arms):
        raise UserError(f"{source}: arms must be [[arms]] tables")
    by_name = {a["name"]: a for a in data_arms if isinstance(a.get("name"), str)}
    out = []
    for n in names:
        if n not in by_name:
            have = ", ".join(k if k.isprintable() else repr(k) for k in by_name)
            raise UserError(f"--arms: no arm named {n!r} (have: {have})")
        out.append(by_name[n])
    return out


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    node = data
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise UserError(f"cannot override {key}: {part} is not a table")
        node = child
    node[leaf] = value


def config_to_dict(cfg: Config) -> dict[str, Any]:
    return cfg.model_dump(mode="json")


def with_overrides(cfg: Config, overrides: dict[str, Any], source: str) -> Config:
    """cfg with dotted-key overrides applied, validated again."""
    data = config_to_dict(cfg)
    for key, value in overrides.items():
        _set_dotted(data, key, value)
    return parse_config(data, source)


def config_from_manifest(manifest: dict[str, Any], source: str) -> Config:
    """The config a run recorded (redacted): secrets restored from the environment where they can be."""
    data = manifest.get("config")
    if not isinstance(data, dict):
        raise UserError(f"{source}: has no config table (file damaged)")
    return parse_config(restore_secrets(data, source), source)


def config_difference(a: Config, b: Config, sections: tuple[str, ...]) -> str | None:
    """The first dotted key (redacted values) where two configs differ within `sections`, or None."""
    da, db = redact_config(config_to_dict(a)), redact_config(config_to_dict(b))

    def first(x: Any, y: Any, path: str) -> str | None:
        if isinstance(x, dict) and isinstance(y, dict):
            for k in list(x) + [k for k in y if k not in x]:
                d = first(x.get(k), y.get(k), f"{path}.{k}" if path else k)
                if d:
                    return d
            return None
        if isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
            for i, (p, q) in enumerate(zip(x, y)):
                d = first(p, q, f"{path}.{i}")
                if d:
                    return d
            return None
        return None if x == y else path

    for s in sections:
        d = first(da.get(s), db.get(s), s)
        if d:
            return d
    return None
