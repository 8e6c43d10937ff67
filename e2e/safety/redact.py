"""Secrets out of everything the harness writes: one name rule, one way to hide a value.

Two mechanisms, because a secret reaches files two ways:
- by NAME: an environment variable or a flag whose name looks like a secret (SECRET_NAME) has its
  value replaced by REDACTED wherever the harness writes it (manifest config, server argv and env,
  the `# argv:` line of a server log, gsm8k unit.json);
- by VALUE: what a server prints on its own (vLLM logs its non-default arguments; a crashing
  server may dump its environment) is scrubbed afterwards: every value of a secret-named variable
  or flag the server was given, and the API key, is replaced in its log file and in any log tail
  kept in a row (scrub, scrub_file), in each spelling a server or Python prints a value with
  (spellings: JSON, repr and ascii(), URL-encoded, shell-quoted, and those escaped once more).
A flag is a secret flag by its name, in argparse's abbreviations too (`--hf-tok` is `--hf-token`
to vLLM), and a config's args are redacted as the server receives them: server.extra_args then
the arm's args, so a secret flag ending one hides the value that starts the other.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from e2e.errors import UserError

# Substrings of a secret's name, case-insensitive. TOKENS/TOKENIZER are counts and paths
# (--max-num-batched-tokens, --tokenizer), not secrets; PAT only as a whole part (GH_PAT, PAT_X),
# never inside PATH.
SECRET_NAME = re.compile(
    r"TOKEN(?!S|IZER)|KEY|SECRET|PASS|PWD|CREDENTIAL|AUTH|COOKIE|(?<![A-Z0-9])PAT(?![A-Z0-9])", re.I
)
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


# vLLM's flags whose value is a secret but whose name the rule may not catch once abbreviated:
# argparse takes any unambiguous prefix (`--hf-tok V` sets --hf-token), vLLM `_` for `-`.
SECRET_FLAGS = ("--hf-token", "--api-key")
_MIN_ABBREV = 4  # "--hf", "--ap": shorter prefixes are ambiguous to vLLM's parser anyway


def _secret_flag(a: str) -> bool:
    if not a.startswith("--") or len(a) <= 2:
        return False
    name = "--" + a[2:].split("=", 1)[0].replace("_", "-")
    return is_secret_name(name) or (len(name) >= _MIN_ABBREV and any(f.startswith(name) for f in SECRET_FLAGS))


def _secret_positions(args: Sequence[str]) -> list[tuple[int, bool]]:
    """(index, inline) of every secret value in an argument list: `--flag=V` (inline) or the
    argument after `--flag`, unless that is itself a flag (vLLM's --hf-token takes an optional
    value: `--hf-token --dtype half` keeps `--dtype`)."""
    out = []
    for i, a in enumerate(args):
        if _secret_flag(a):
            if "=" in a:
                out.append((i, True))
            elif i + 1 < len(args) and not str(args[i + 1]).startswith("--"):
                out.append((i + 1, False))
    return out


def redact_args(args: Sequence[str]) -> list[str]:
    """Hide the value after any flag that names a secret (--api-key K, --hf-token=T, --hf-tok T)."""
    out = [str(a) for a in args]
    for i, inline in _secret_positions(out):
        out[i] = out[i].split("=", 1)[0] + "=" + REDACTED if inline else REDACTED
    return out


def _arg_secrets(args: Sequence[str]) -> list[str]:
    return [str(args[i]).split("=", 1)[1] if inline else str(args[i]) for i, inline in _secret_positions(args)]


def _arms(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """A config dict's arms, where they are a list of dicts (anything else is left as it is)."""
    arms = cfg.get("arms")
    return [a for a in arms if isinstance(a, dict)] if isinstance(arms, list) else []


def redact_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """A config dict (config_to_dict) with every env value and flag value that names a secret
    hidden: server.env, server.extra_args, and each arm's env and args."""
    out = copy.deepcopy(dict(cfg))
    server = out.get("server")
    head: list[str] = []  # server.extra_args: the start of every arm's argument list
    if isinstance(server, dict):
        if isinstance(server.get("env"), dict):
            server["env"] = redact_env(server["env"])
        if isinstance(server.get("extra_args"), (list, tuple)):
            head = [str(a) for a in server["extra_args"]]
            server["extra_args"] = redact_args(head)
    for arm in _arms(out):
        if isinstance(arm.get("env"), dict):
            arm["env"] = redact_env(arm["env"])
        if isinstance(arm.get("args"), (list, tuple)):
            # as the server gets them: a secret flag ending extra_args takes the arm's first arg
            arm["args"] = redact_args(head + [str(a) for a in arm["args"]])[len(head) :]
    return out


def restore_secrets(cfg: Mapping[str, Any], source: str, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
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
                    raise UserError(
                        f"{source}: {where}.env.{k} was recorded redacted; export {k} "
                        "to the value the run used and try again"
                    )
                v = environ[k]
            fixed[k] = v
        return fixed

    def args_of(where: str, args: Any) -> None:
        if isinstance(args, (list, tuple)) and any(REDACTED in str(a) for a in args):
            raise UserError(
                f"{source}: {where} hides a secret flag value that cannot be restored; "
                "pass secrets through environment variables instead"
            )

    server = out.get("server")
    if isinstance(server, dict):
        server["env"] = env_of("server", server.get("env", {}))
        args_of("server.extra_args", server.get("extra_args"))
    for arm in _arms(out):
        arm["env"] = env_of(f"arms.{arm.get('name')}", arm.get("env", {}))
        args_of(f"arms.{arm.get('name')}.args", arm.get("args"))
    return out


def secret_values(
    env: Mapping[str, str] | None = None, args: Sequence[str] = (), extra: Iterable[str] = ()
) -> frozenset[str]:
    """The values to scrub from what a server prints: those of its secret-named environment
    variables and flags, plus `extra` (the API key)."""
    vals = [v for k, v in (env or {}).items() if is_secret_name(k) and k not in _NOT_SECRET_VALUES]
    vals += _arg_secrets(list(args)) + list(extra)
    return frozenset(
        v
        for v in vals
        if isinstance(v, str) and len(v) >= _MIN_SCRUB_LEN and v.lower() not in _COMMON and v != REDACTED
    )


def _json(s: str) -> str:
    return json.dumps(s)[1:-1]


def _json_utf8(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)[1:-1]


def _repr(s: str) -> str:
    return repr(s)[1:-1]


def _utf8(s: str) -> bytes:
    """The bytes a process writes for s; os.environ holds undecodable bytes as surrogates."""
    try:
        return s.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return s.encode("utf-8", "surrogatepass")


def _url_lower(s: str) -> str:
    return re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), urllib.parse.quote(s, safe=""))


# How a value is printed: JSON (\uXXXX or UTF-8; either hex case), Python's repr and ascii() of the
# str and of its UTF-8 bytes, URL encoding (path or form, either hex case), shell quoting.
_ENCODINGS = (
    _json,
    _json_utf8,
    lambda s: re.sub(r"\\u[0-9a-f]{4}", lambda m: m.group(0).upper(), _json(s)),
    _repr,
    lambda s: ascii(s)[1:-1],
    lambda s: repr(_utf8(s))[2:-1],
    lambda s: urllib.parse.quote(s, safe=""),
    urllib.parse.quote,
    urllib.parse.quote_plus,
    _url_lower,
    shlex.quote,
)
# ... and a dump inside a dump (a JSON log line holding a repr or JSON string) escapes it again.
_ESCAPES = (_json, _json_utf8, _repr)


def spellings(secret: str) -> frozenset[str]:
    """Every form in which a server or Python may print `secret` (the value itself included)."""
    first = {secret} | {enc(secret) for enc in _ENCODINGS}
    return frozenset({t for f in first for t in (f, *(esc(f) for esc in _ESCAPES))} - {""})


def _needles(secrets: Iterable[str]) -> list[str]:
    """All spellings of all secrets, longest first (no partial leftovers of a longer one)."""
    return sorted({sp for s in secrets if s for sp in spellings(s)}, key=len, reverse=True)


def scrub(text: str, secrets: Iterable[str]) -> str:
    """text with every spelling of every secret value replaced by REDACTED."""
    for s in _needles(secrets):
        text = text.replace(s, REDACTED)
    return text


def scrub_file(path: Path, secrets: Iterable[str]) -> bool:
    """Scrub a file in place (bytes: a log need not be UTF-8). True when something was replaced.

    The scrubbed copy replaces the file atomically. A full disk has no room for that copy: the
    file's own bytes are then overwritten with a mask of the same length (no new block needed),
    and as a last resort the file is emptied. A secret never stays."""
    needles = [_utf8(s) for s in _needles(secrets)]
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError:
        return False
    new = data
    for s in needles:
        new = new.replace(s, REDACTED.encode())
    if new == data:
        return False
    tmp = path.with_name(f".{path.name}.scrub-{os.getpid()}")
    try:
        # a new name only (O_EXCL), never through a link planted at it (O_NOFOLLOW)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(new)
        os.chmod(tmp, os.stat(path).st_mode & 0o777)
        os.replace(tmp, path)
        return True
    except FileExistsError:
        pass  # not ours to remove: mask in place below
    except OSError:
        tmp.unlink(missing_ok=True)
    masked = data
    for s in needles:
        masked = masked.replace(s, REDACTED.encode()[: len(s)].ljust(len(s), b"*"))
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    try:
        try:
            off = 0
            while off < len(masked):
                off += os.pwrite(fd, masked[off:], off)
            os.fsync(fd)
        except OSError:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)
    return True
