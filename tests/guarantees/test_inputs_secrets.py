"""Issue 22, gap 5: secrets in other spellings. A secret printed escaped (JSON, repr, ascii, URL,
shell quoting), a secret flag abbreviated the way argparse accepts it (`--hf-tok V`), a secret flag
whose value is the first of an arm's args, and the API key in the log of a server stopped on a full
disk: none reaches the run folder in clear. Issue 35: nor in hex, base64 (alone or inside a longer
base64 text, as in Basic auth) or UTF-16; and a large log is scrubbed a chunk at a time, in bounded
memory, a secret cut by a chunk's end included.

The STAND-IN server (a `server.python` the harness launches exactly as it launches vLLM) is used
because a real vLLM cannot be made to print its environment and argv in every encoding on demand;
it prints them and exits, and the harness then scrubs the log. The full-disk case uses a real
tmpfs (root only; skipped elsewhere).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import subprocess
import sys
import time
import tracemalloc
import urllib.parse
from pathlib import Path

import pytest

from e2e.cli import main
from e2e.rundir.store import MANIFEST
from e2e.safety.redact import REDACTED, redact_args, redact_config, scrub, scrub_file, secret_values
from e2e.serve import launch
from tests.support import executable
from tests.support.hardening import base_cfg, write_cfg

# Each holds a backslash, a double quote, a single quote or a non-ASCII letter: characters every
# encoding below spells differently from the raw value.
SECRETS = {
    "env": 'hf\\tok"en-é-0001',
    "split": "spl'it\\-ü-0002",
    "abbr": 'ab"br-ß-0003',
    "abbr_eq": "ab\\beq-ø-0004",
    "url": "u r&l=/é-0005",
}


def spellings(s: str) -> dict[str, str]:
    """How Python and a server may print s, computed here independently of e2e/safety/redact.py."""
    return {
        "raw": s,
        "json": json.dumps(s)[1:-1],
        "json-utf8": json.dumps(s, ensure_ascii=False)[1:-1],
        "repr": repr(s)[1:-1],
        "ascii": ascii(s)[1:-1],
        "bytes-repr": repr(s.encode())[2:-1],
        "url": urllib.parse.quote(s, safe=""),
        "url-plus": urllib.parse.quote_plus(s),
        "url-lower": urllib.parse.quote(s, safe="").lower() if "%" in urllib.parse.quote(s, safe="") else s,
        "shell": shlex.quote(s),
        "json-in-json": json.dumps(json.dumps(s))[3:-3],
    }


def binary_spellings(s: str) -> dict[str, bytes]:
    """s as hex, base64 and UTF-16 (issue 35: none was scrubbed), computed here independently too."""
    b = s.encode()
    return {
        "hex": b.hex().encode(),
        "HEX": b.hex().upper().encode(),
        "base64": base64.b64encode(b),
        "base64-unpadded": base64.b64encode(b).rstrip(b"="),
        "base64url": base64.urlsafe_b64encode(b),
        "utf-16-le": s.encode("utf-16-le"),
        "utf-16-be": s.encode("utf-16-be"),
    }


def holds_in_base64(data: bytes, secret: str) -> bool:
    """Whether any base64 run in data, at any of its four alignments, decodes to bytes holding secret."""
    for run in re.findall(rb"[A-Za-z0-9+/_-]{8,}={0,2}", data):
        run = run.translate(bytes.maketrans(b"-_", b"+/")).rstrip(b"=")
        for k in range(4):
            part = run[k:]
            part = part[: len(part) - len(part) % 4]
            if secret.encode() in base64.b64decode(part + b"=" * 0, validate=False):
                return True
    return False


def test_each_spelling_is_a_different_string():
    """Not vacuous: for these values the escaped forms are not the raw value (a raw-only scrub misses them)."""
    for s in SECRETS.values():
        sp = spellings(s)
        assert sum(v != s for v in sp.values()) >= 6, sp


@pytest.mark.parametrize("name", sorted(SECRETS))
def test_scrub_removes_every_spelling(name, tmp_path):
    s = SECRETS[name]
    text = "\n".join(f"{k}: <<{v}>>" for k, v in spellings(s).items())
    out = scrub(text, {s})
    for k, v in spellings(s).items():
        assert v not in out, (k, out)
    assert out.count(REDACTED) >= len(spellings(s)) and "json-utf8: <<" in out
    f = tmp_path / "log"
    f.write_bytes(text.encode())
    assert scrub_file(f, {s})
    data = f.read_bytes()
    for k, v in spellings(s).items():
        assert v.encode() not in data, k


@pytest.mark.parametrize("name", sorted(SECRETS))
def test_scrub_removes_hex_base64_and_utf16_spellings(name, tmp_path):
    s = SECRETS[name]
    f = tmp_path / "log"
    lines = [f"{k}: <<".encode() + v + b">>" for k, v in binary_spellings(s).items()]
    # inside a longer base64 text at each of the three alignments, as in `Authorization: Basic ...`
    lines += [b"basic: " + base64.b64encode(pre + s.encode() + b"@host:1") for pre in (b"u:", b"us:", b"use:")]
    f.write_bytes(b"\n".join(lines) + b"\n")
    assert holds_in_base64(f.read_bytes(), s)  # not vacuous: the lines hold it
    assert scrub_file(f, {s})
    data = f.read_bytes()
    for k, v in binary_spellings(s).items():
        assert v not in data, k
    assert not holds_in_base64(data, s)
    assert data.count(REDACTED.encode()) >= len(lines)
    text = "\n".join(v.decode("utf-8", "replace") for v in binary_spellings(s).values())
    for k, v in binary_spellings(s).items():  # a log tail is the log's bytes decoded: the same, as text
        assert v.decode("utf-8", "replace") not in scrub(text, {s}), k


def test_a_large_log_is_scrubbed_in_bounded_memory_and_across_its_chunks(tmp_path):
    # was: the whole file read, then one copy of it per spelling replaced (a 500 MB log took 2.0 GB)
    key, mib = "k" * 28 + "0123", 1 << 20
    log = tmp_path / "big.log"
    line = b"INFO 05-12 12:00:01 [api_server.py:123] ordinary text of a long-running server\n"
    with open(log, "wb") as f:
        for i in range(48):  # 48 MiB, a key across every MiB boundary (where a chunked read cuts it)
            f.write((line * (mib // len(line) + 1))[: mib - 16 - (f.tell() - i * mib)] + key.encode())
    planted = log.read_bytes().count(key.encode())
    assert planted == 48 and log.stat().st_size > 48 * mib
    tracemalloc.start()
    try:
        assert scrub_file(log, {key})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 12 * mib, f"{peak / mib:.0f} MiB"
    data = log.read_bytes()
    assert key.encode() not in data and data.count(REDACTED.encode()) == planted


def test_scrub_leaves_ordinary_text_alone():
    text = "INFO args: model='m', dtype='half', url=http://127.0.0.1:8000/v1 \\n \"x\""
    assert scrub(text, {"s3cr3t-value"}) == text


@pytest.mark.parametrize(
    "args, hidden",
    [
        (["--hf-tok", "V-abcdef"], ["--hf-tok", REDACTED]),
        (["--hf-tok=V-abcdef"], [f"--hf-tok={REDACTED}"]),
        (["--hf_tok", "V-abcdef"], ["--hf_tok", REDACTED]),
        (["--hf-t", "V-abcdef"], ["--hf-t", REDACTED]),
        (["--api-k=V-abcdef"], [f"--api-k={REDACTED}"]),
    ],
)
def test_an_abbreviated_secret_flag_is_redacted_and_scrubbed(args, hidden):
    assert redact_args(args) == hidden
    assert "V-abcdef" in secret_values({}, args)


def test_ordinary_flags_and_their_abbreviations_keep_their_values():
    args = ["--hf-overrides", "{}", "--dtype", "half", "--host-x", "y", "--max-num-batched-tokens", "64"]
    assert redact_args(args) == args and secret_values({}, args) == frozenset()


def test_a_valueless_secret_flag_does_not_hide_the_next_flag():
    """vLLM's --hf-token takes an optional value: `--hf-token --dtype half` keeps `--dtype half`."""
    assert redact_args(["--hf-token", "--dtype", "half"]) == ["--hf-token", "--dtype", "half"]


def test_a_secret_flag_split_between_server_args_and_an_arms_args_is_redacted():
    cfg = {
        "server": {"extra_args": ["--dtype", "half", "--hf-token"]},
        "arms": [
            {"name": "a", "args": ["tok-split-1", "--x", "1"]},
            {"name": "b", "args": []},
            {"name": "c", "args": ["--hf-tok", "tok-split-2"]},
        ],
    }
    out = redact_config(cfg)
    assert out["server"]["extra_args"] == ["--dtype", "half", "--hf-token"]
    assert out["arms"][0]["args"] == [REDACTED, "--x", "1"]
    assert out["arms"][1]["args"] == [] and out["arms"][2]["args"] == ["--hf-tok", REDACTED]
    assert cfg["arms"][0]["args"][0] == "tok-split-1"  # the input is not changed


STANDIN = f"""#!{sys.executable}
import base64, json, os, shlex, sys, urllib.parse
env = {{k: v for k, v in os.environ.items() if k in ("HF_TOKEN", "DB_PASS", "VLLM_API_KEY")}}
print("json:", json.dumps(sys.argv), json.dumps(env))
print("json-utf8:", json.dumps(sys.argv, ensure_ascii=False), json.dumps(env, ensure_ascii=False))
print("repr:", repr(sys.argv), repr(env))
print("ascii:", ascii(sys.argv), ascii(env))
print("bytes:", [a.encode() for a in sys.argv], {{k: v.encode() for k, v in env.items()}})
print("url:", urllib.parse.urlencode(env), "&".join(urllib.parse.quote(a, safe="") for a in sys.argv))
print("shell:", shlex.join(sys.argv))
print("nested:", json.dumps(json.dumps(env)))
vals = [*sys.argv, *env.values()]
print("hex:", " ".join(v.encode().hex() for v in vals), " ".join(v.encode().hex().upper() for v in vals))
print("base64:", " ".join(base64.b64encode(v.encode()).decode() for v in vals))
print("base64url:", " ".join(base64.urlsafe_b64encode(v.encode()).decode() for v in vals))
print("basic:", " ".join(base64.b64encode(b"user:" + v.encode()).decode() for v in vals), flush=True)
sys.stdout.buffer.write(b"utf-16: " + " ".join(vals).encode("utf-16-le") + b"\\n")
sys.exit(3)
"""


def test_no_spelling_of_any_secret_reaches_the_run_folder(tmp_path, capsys):
    standin = executable(tmp_path / "vllm-standin", STANDIN)
    s = SECRETS
    data = base_cfg(standin)
    data["server"].update(env={"HF_TOKEN": s["env"]}, extra_args=["--dtype", "float32", "--hf-token"])
    data["arms"] = [
        {"name": "a", "args": [s["split"], "--hf-tok", s["abbr"]], "env": {"DB_PASS": s["url"]}},
        {"name": "b", "args": [s["split"], f"--hf_tok={s['abbr_eq']}"]},
    ]
    cfg = write_cfg(tmp_path / "c.toml", data)
    assert main(["--config", str(cfg), "--out", str(tmp_path), "--run-id", "r", "--no-progress"]) == 1
    capsys.readouterr()
    run = tmp_path / "r"
    keys = {**s, "api_key": launch.session_api_key()}
    needles = {f"{name}/{k}": v.encode() for name, sec in keys.items() for k, v in spellings(sec).items()}
    needles |= {f"{name}/{k}": v for name, sec in keys.items() for k, v in binary_spellings(sec).items()}
    files = [p for p in run.rglob("*") if p.is_file()]
    assert len(files) >= 8
    for p in files:
        blob = p.read_bytes()
        for what, v in needles.items():
            assert v not in blob, f"{what} {v!r} leaked into {p}"
        for name, sec in keys.items():
            assert not holds_in_base64(blob, sec), f"{name} in base64 in {p}"
    # Not vacuous: the stand-in printed every encoding, and the log kept the lines, scrubbed.
    log = (run / "logs" / "p1-d16-a.a0.log").read_bytes()
    heads = (
        "json",
        "json-utf8",
        "repr",
        "ascii",
        "bytes",
        "url",
        "shell",
        "nested",
        "hex",
        "base64",
        "basic",
        "utf-16",
    )
    for head in heads:
        line = log.split(f"\n{head}: ".encode())[1].split(b"\n")[0]
        assert REDACTED.encode() in line, head
    m = json.loads((run / MANIFEST).read_text())
    assert m["config"]["arms"][0]["args"] == [REDACTED, "--hf-tok", REDACTED]
    assert m["config"]["arms"][1]["args"] == [REDACTED, f"--hf_tok={REDACTED}"]


# -- a full disk ------------------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    """A 512 KiB tmpfs: a real full disk. Needs root (mount); skipped elsewhere."""
    d = tmp_path / "disk"
    d.mkdir()
    if (
        os.geteuid() != 0
        or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(d)], capture_output=True).returncode
        != 0
    ):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def _fill(folder: Path) -> None:
    with open(folder / "filler", "wb", buffering=0) as f:
        for size in (65536, 4096, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                pass


def test_the_api_key_is_scrubbed_from_a_log_on_a_full_disk(small_disk):
    from e2e.serve.server import ServerSpec, VllmServer

    script = executable(
        small_disk / "sleeper",
        f"#!{sys.executable}\nimport json, os, time\n"
        "print('env:', json.dumps({'VLLM_API_KEY': os.environ['VLLM_API_KEY'], "
        "'DB_PASS': os.environ['DB_PASS']}), flush=True)\ntime.sleep(60)\n",
    )
    log = small_disk / "cell.log"
    key = "k" * 28 + "0123"
    srv = VllmServer(
        ServerSpec(python=str(script), model="m", env={"DB_PASS": 'pw"é-123456'}), log, stop_timeout_s=5, api_key=key
    )
    srv.start()
    deadline = time.monotonic() + 20
    while key.encode() not in log.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert key.encode() in log.read_bytes()
    with open(log, "ab") as f:  # end the log on a page boundary: its next line needs a new block
        f.write(b"." * (-log.stat().st_size % 4096))
    _fill(small_disk)
    with pytest.raises(OSError):  # the disk really is full
        (small_disk / "probe").write_bytes(b"x" * 4096)
    assert srv.stop() == []
    data = log.read_bytes()
    assert key.encode() not in data and json.dumps('pw"é-123456')[1:-1].encode() not in data
    assert data.startswith(b"# argv: ") and b"env: " in data  # the log itself is kept
    assert not [p.name for p in small_disk.iterdir() if ".scrub-" in p.name]  # no half-written copy left
