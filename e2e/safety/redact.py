"""Secrets out of everything the harness writes: one name rule, one way to hide a value.

Two mechanisms, because a secret reaches files two ways:
- by NAME: an environment variable or a flag whose name looks like a secret (SECRET_NAME) has its
  value replaced by REDACTED wherever the harness writes it (manifest config, server argv and env,
  the `# argv:` line of a server log, gsm8k unit.json);
- by VALUE: what a server prints on its own (vLLM logs its non-default arguments; a crashing
  server may dump its environment) is scrubbed afterwards: every value of a secret-named variable
  or flag the server was given, and the API key, is replaced in its log file and in any log tail
  kept in a row (scrub, scrub_file), in each spelling a server or Python prints a value with
  (spellings: JSON, repr and ascii(), URL-encoded, shell-quoted, and those escaped once more; hex
  and base64 of its UTF-8, base64 inside a longer base64 text too; UTF-16). Not covered, and said
  so in docs/guarantees/security.md: a value cut by a line break or wrapped, only part of a value,
  and any other transformation (compressed, encrypted, another escaping).
A flag is a secret flag by its name, in argparse's abbreviations too (`--hf-tok` is `--hf-token`
to vLLM), and a config's args are redacted as the server receives them: server.extra_args then
the arm's args, so a secret flag ending one hides the value that starts the other.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import re
import shlex
import stat
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

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
_MIN_BASE64 = 8  # characters of a secret's own bits inside a longer base64 text: fewer match ordinary text
_URLSAFE = str.maketrans("+/", "-_")


def _binary(s: str) -> set[str]:
    """s's UTF-8 bytes as text: hex (either case) and base64 (standard and URL-safe alphabets), the
    whole encoding (padded or not) and, for each of the three alignments it can have inside a longer
    base64 text (a `user:password` in Basic auth), the characters that hold its bits only."""
    b = _utf8(s)
    whole = base64.b64encode(b).decode()
    out = {b.hex(), b.hex().upper(), whole, whole.rstrip("=")}
    for k in range(3):  # k bytes before it: character i holds bits 6i..6i+5 of the whole
        enc = base64.b64encode(b"\0" * k + b).decode()
        core = enc[-(-8 * k // 6) : 8 * (k + len(b)) // 6]
        if len(core) >= _MIN_BASE64:
            out.add(core)
    return out | {x.translate(_URLSAFE) for x in out}


def _utf16(s: str) -> list[bytes]:
    """s as a UTF-16 writer puts it in a file, either byte order."""
    return [s.encode(enc, "surrogatepass") for enc in ("utf-16-le", "utf-16-be")]


def spellings(secret: str) -> frozenset[str]:
    """Every form in which a server or Python may print `secret` as text (the value itself included;
    UTF-16 as a log tail reads it: its bytes decoded as UTF-8, what is not UTF-8 replaced)."""
    first = {secret} | {enc(secret) for enc in _ENCODINGS}
    escaped = {t for f in first for t in (f, *(esc(f) for esc in _ESCAPES))}
    utf16 = {b.decode("utf-8", "replace") for b in _utf16(secret)}
    return frozenset((escaped | _binary(secret) | utf16) - {""})


def _needles(secrets: Iterable[str]) -> list[str]:
    """All spellings of all secrets, longest first."""
    return sorted({sp for s in secrets if s for sp in spellings(s)}, key=len, reverse=True)


def _byte_needles(secrets: Iterable[str]) -> list[bytes]:
    """What to find in a file's bytes: every spelling's UTF-8, and each value in UTF-16."""
    found = {_utf8(t) for t in _needles(secrets)} | {b for s in secrets if s for b in _utf16(s)}
    return sorted(found, key=len, reverse=True)


_Text = TypeVar("_Text", str, bytes)


def _regions(buf: _Text, needles: Sequence[_Text]) -> list[list[int]]:
    """[start, end) of every needle in buf, in order, overlapping ones merged into one: nothing of a
    secret is left beside another that overlaps it."""
    spans = []
    for n in needles:
        i = buf.find(n)
        while i != -1:
            spans.append((i, i + len(n)))
            i = buf.find(n, i + len(n))
    merged: list[list[int]] = []
    for a, b in sorted(spans):
        if merged and a < merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return merged


def _replace(buf: _Text, regions: list[list[int]], mark: Callable[[int], _Text]) -> _Text:
    parts, pos = [], 0
    for a, b in regions:
        parts += [buf[pos:a], mark(b - a)]
        pos = b
    parts.append(buf[pos:])
    return buf[:0].join(parts)


def scrub(text: str, secrets: Iterable[str]) -> str:
    """text with every spelling of every secret value replaced by REDACTED."""
    return _replace(text, _regions(text, _needles(secrets)), lambda n: REDACTED)


_CHUNK = 1 << 20  # a file is scrubbed a chunk at a time: memory stays this (and the longest spelling)
_REDACTED_BYTES = REDACTED.encode()


def _pieces(read: Callable[[int], bytes], needles: list[bytes]) -> Iterator[tuple[int, bytes, list[list[int]]]]:
    """(offset, piece, where the spellings are in it) of all that read() gives, a chunk at a time:
    the last bytes of a chunk that could start a spelling wait for the next chunk."""
    keep = max(map(len, needles)) - 1
    buf, at = b"", 0
    while True:
        chunk = read(_CHUNK)
        buf += chunk
        cut = len(buf) - keep if chunk else len(buf)  # a spelling starting before cut lies in buf whole
        regions = [r for r in _regions(buf, needles) if r[0] < cut]
        end = max(cut, regions[-1][1] if regions else 0, 0)
        yield at, buf[:end], regions
        buf, at = buf[end:], at + end
        if not chunk:
            return


def _open_regular(path: Path) -> Any:
    """path opened for reading when it is a regular file (never through a link; a FIFO does not
    block the open), else None."""
    try:
        f = open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK), "rb")
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
        f.close()
        return None
    return f


def found_in_file(path: Path, pattern: re.Pattern[bytes], longest: int) -> set[bytes]:
    """Every match of `pattern` (at most `longest` bytes) in a regular file, read a chunk at a time:
    what a log holds (a dead harness's API key, found by its digest) without reading it whole. Empty
    when it is not a regular file or cannot be read."""
    f = _open_regular(path)
    if f is None:
        return set()
    found: set[bytes] = set()
    with f:
        tail = b""
        while chunk := f.read(_CHUNK):
            buf = tail + chunk
            found.update(m.group(0) for m in pattern.finditer(buf))
            tail = buf[-(longest + 1) :]  # a match cut by the chunk's end, and the byte before it
    return found


def scrub_file(path: Path, secrets: Iterable[str]) -> bool:
    """Scrub a file in place (bytes: a log need not be UTF-8). True when something was replaced.

    Only a regular file is read or written: a link, FIFO or device is left alone (nothing is read or
    written through one). It is read a chunk at a time, never whole (a log may be gigabytes), into a
    scrubbed copy that replaces it atomically (and is dropped when there was nothing to replace). A
    full disk has no room for that copy: each secret is then overwritten in the file itself by as
    many bytes (no new block needed), and as a last resort the file is emptied. A secret never stays."""
    needles = _byte_needles(secrets)
    path = Path(path)
    src = _open_regular(path)
    if src is None:
        return False
    with src:
        st = os.fstat(src.fileno())
        if not needles:
            return False
        tmp = path.with_name(f".{path.name}.scrub-{os.getpid()}")
        try:
            # a new name only (O_EXCL), never through a link planted at it (O_NOFOLLOW)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            pass  # not ours to remove: mask in place below
        except OSError:
            return _mask_in_place(path, src, needles)  # no room even for an empty file
        else:
            try:
                found = False
                with os.fdopen(fd, "wb") as f:
                    for _, piece, regions in _pieces(src.read, needles):
                        f.write(_replace(piece, regions, lambda n: _REDACTED_BYTES))
                        found = found or bool(regions)
                if found:
                    os.chmod(tmp, st.st_mode & 0o777)
                    os.replace(tmp, path)
                    return True
                tmp.unlink()
                return False
            except OSError:
                tmp.unlink(missing_ok=True)
        src.seek(0)
        return _mask_in_place(path, src, needles)


def _mask_in_place(path: Path, src: Any, needles: list[bytes]) -> bool:
    """Overwrite each spelling in the file that `src` reads by as many bytes (REDACTED, then '*'),
    opened for writing only once there is one; empty the file if that fails."""
    fd = None
    try:
        for at, _, regions in _pieces(src.read, needles):
            for a, b in regions:
                if fd is None:
                    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
                    if not os.path.samestat(os.fstat(fd), os.fstat(src.fileno())):
                        return False  # replaced meanwhile: not the file that was read
                os.pwrite(fd, _REDACTED_BYTES[: b - a].ljust(b - a, b"*"), at + a)
        if fd is not None:
            os.fsync(fd)
    except OSError:
        if fd is None:
            raise
        os.ftruncate(fd, 0)
    finally:
        if fd is not None:
            os.close(fd)
    return fd is not None
