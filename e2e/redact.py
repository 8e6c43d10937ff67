"""Secrets out of everything the harness writes: one name rule, one way to hide a value.

Two mechanisms, because a secret reaches files two ways:
- by NAME: an environment variable or a flag whose name looks like a secret (SECRET_NAME) has its
  value replaced by REDACTED wherever the harness writes it (manifest config, server argv and env,
  the `# argv:` line of a server log, gsm8k unit.json);
- by VALUE: what a server prints on its own (vLLM logs its non-default arguments; a crashing
  server may dump its environment) is scrubbed afterwards: every value of a secret-named variable
  or flag the server was given, and the API key, is replaced in its log file and in any log tail
  kept in a row (scrub, scrub_file).
"""
from __future__ import annotations

import copy
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from e2e.errors import UserError

# Substrings of a secret's name, case-insensitive. TOKENS/TOKENIZER are counts and paths
# (--max-num-batched-tokens, --tokenizer), not secrets; PAT only as a whole part (GH_PAT, PAT_X),
# never inside PATH.
SECRET_NAME = re.compile(
    r"TOKEN(?!S|IZER)|KEY|SECRET|PASS|PWD|CREDENTIAL|AUTH|COOKIE|(?<![A-Z0-9])PAT(?![A-Z0-9])", re.I)
REDACTED = "<redacted>"
# Shell variables whose names match but whose values are paths, not secrets: scrubbing them would
# erase every mention of the working folder from a log.
_NOT_SECRET_VALUES = frozenset({"PWD", "OLDPWD", "SSH_AUTH_SOCK", "XAUTHORITY", "GPG_AGENT_INFO"})
# Values too short or too common to scrub by value (they would erase ordinary log text, e.g. a
# PIP_KEYRING_PROVIDER=auto inherited from the shell); they are still hidden by name.
_MIN_SCRUB_LEN = 6
_COMMON = frozenset({"default", "enabled", "disabled", "keyring", "subprocess"})


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (REDACTED if is_secret_name(k) else v) for k, v in env.items()}


def _secret_flag(a: str) -> bool:
    return a.startswith("--") and is_secret_name(a.split("=", 1)[0])


def redact_args(args: Sequence[str]) -> list[str]:
    """Hide the value after any flag that names a secret (--api-key K, --hf-token=T)."""
    out: list[str] = []
    hide_next = False
    for a in args:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif _secret_flag(a):
            if "=" in a:
                out.append(a.split("=", 1)[0] + "=" + REDACTED)
            else:
                out.append(a)
                hide_next = True
        else:
            out.append(a)
    return out


def _arg_secrets(args: Sequence[str]) -> list[str]:
    out = []
    for i, a in enumerate(args):
        if _secret_flag(a):
            if "=" in a:
                out.append(a.split("=", 1)[1])
            elif i + 1 < len(args):
                out.append(args[i + 1])
    return out


def redact_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """A config dict (config_to_dict) with every env value and flag value that names a secret
    hidden: server.env, server.extra_args, and each arm's env and args."""
    out = copy.deepcopy(dict(cfg))
    server = out.get("server")
    if isinstance(server, dict):
        if isinstance(server.get("env"), dict):
            server["env"] = redact_env(server["env"])
        if isinstance(server.get("extra_args"), (list, tuple)):
            server["extra_args"] = redact_args([str(a) for a in server["extra_args"]])
    for arm in out.get("arms") if isinstance(out.get("arms"), list) else []:
        if isinstance(arm, dict):
            if isinstance(arm.get("env"), dict):
                arm["env"] = redact_env(arm["env"])
            if isinstance(arm.get("args"), (list, tuple)):
                arm["args"] = redact_args([str(a) for a in arm["args"]])
    return out


def restore_secrets(cfg: Mapping[str, Any], source: str,
                    environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The inverse of redact_config where it can be undone: a redacted env value comes back from
    the harness's own environment (export it before resuming); a redacted flag value cannot come
    back at all. One line naming the field otherwise."""
    environ = os.environ if environ is None else environ
    out = copy.deepcopy(dict(cfg))

    def env_of(where: str, env: Any) -> Any:
        if not isinstance(env, dict):
            return env
        fixed = {}
        for k, v in env.items():
            if v == REDACTED:
                if k not in environ:
                    raise UserError(f"{source}: {where}.env.{k} was recorded redacted; export {k} "
                                    "to the value the run used and try again")
                v = environ[k]
            fixed[k] = v
        return fixed

    def args_of(where: str, args: Any) -> None:
        if isinstance(args, (list, tuple)) and any(REDACTED in str(a) for a in args):
            raise UserError(f"{source}: {where} hides a secret flag value that cannot be restored; "
                            "pass secrets through environment variables instead")

    server = out.get("server")
    if isinstance(server, dict):
        server["env"] = env_of("server", server.get("env", {}))
        args_of("server.extra_args", server.get("extra_args"))
    for arm in out.get("arms") if isinstance(out.get("arms"), list) else []:
        if isinstance(arm, dict):
            arm["env"] = env_of(f"arms.{arm.get('name')}", arm.get("env", {}))
            args_of(f"arms.{arm.get('name')}.args", arm.get("args"))
    return out


def secret_values(env: Mapping[str, str] | None = None, args: Sequence[str] = (),
                  extra: Iterable[str] = ()) -> frozenset[str]:
    """The values to scrub from what a server prints: those of its secret-named environment
    variables and flags, plus `extra` (the API key)."""
    vals = [v for k, v in (env or {}).items() if is_secret_name(k) and k not in _NOT_SECRET_VALUES]
    vals += _arg_secrets(list(args)) + list(extra)
    return frozenset(v for v in vals if isinstance(v, str) and len(v) >= _MIN_SCRUB_LEN
                     and v.lower() not in _COMMON and v != REDACTED)


def scrub(text: str, secrets: Iterable[str]) -> str:
    """text with every secret value replaced by REDACTED (longest first: no partial leftovers)."""
    for s in sorted(set(secrets), key=len, reverse=True):
        if s:
            text = text.replace(s, REDACTED)
    return text


def scrub_file(path: Path, secrets: Iterable[str]) -> bool:
    """Scrub a file in place (bytes: a log need not be UTF-8). True when something was replaced."""
    secrets = sorted({s for s in secrets if s}, key=len, reverse=True)
    try:
        data = Path(path).read_bytes()
    except OSError:
        return False
    new = data
    for s in secrets:
        new = new.replace(s.encode(), REDACTED.encode())
    if new == data:
        return False
    tmp = Path(path).with_name(f".{Path(path).name}.scrub-{os.getpid()}")
    tmp.write_bytes(new)
    os.chmod(tmp, os.stat(path).st_mode & 0o777)
    os.replace(tmp, path)
    return True
