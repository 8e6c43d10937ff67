#!/usr/bin/env python3
"""Pin the wheels of an offline vLLM bundle for the GPU machine: maintainers/gpu/bundle/vllm-VERSION.lock.

    python3 maintainers/gpu/bundle_lock.py 0.23.0 [--work DIR] [--uv PATH]

1. uv resolves vllm==VERSION for CPython 3.12 on x86-64 manylinux_2_31 (wheels only), the machine's known versions
   forced (bundle/machine.txt, `--override`) and the groups in bundle/drop.txt removed (an override
   whose marker never holds drops a requirement and whatever only it needed).
2. Kept: every resolved package reachable from vLLM through packages the machine does not have.
3. Each kept wheel is fetched by pip (--no-deps, the machine's platform tags) and its sha256 checked
   against the hashes PyPI's index gave the resolver; the lock names that one file and its hash, so
   make_bundle.sh downloads with `pip --require-hashes` and gets the same bytes.
uv is not in the project's venv: it is installed into WORK/uv (pinned) when not given.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "bundle"
UV_PIN = "uv==0.13.8"
PY = "3.12"
UV_PLATFORM = "x86_64-manylinux_2_31"  # the 0.26.0 bundle's llguidance (2_31) ran there
# pip's tags for the same machine (pip matches each manylinux_2_N exactly).
PIP_PLATFORMS = [
    "manylinux_2_31_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_26_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
]
PIP_TARGET = [
    "--only-binary=:all:",
    "--python-version",
    PY,
    "--implementation",
    "cp",
    *[a for p in PIP_PLATFORMS for a in ("--platform", p)],
]


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def names(path: Path) -> list[str]:
    """Lines of a data file (bundle/*.txt) without `#` comments; 'name==version' stays whole."""
    out = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(line)
    return out


def uv_binary(work: Path, given: str | None) -> str:
    if given:
        return given
    uv = work / "uv" / "bin" / "uv"
    if not uv.exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(work / "uv"), UV_PIN], check=True)
    return str(uv)


def resolve(uv: str, version: str, work: Path) -> dict[str, tuple[str, set[str], list[str]]]:
    """name -> (version, PyPI sha256 set, required-by list) from `uv pip compile`."""
    machine = names(DATA / "machine.txt")
    overrides = [m for m in machine if "==" in m]
    overrides += [f'{n} ; sys_platform == "never"' for n in names(DATA / "drop.txt")]
    (work / "in.txt").write_text(f"vllm=={version}\n")
    (work / "overrides.txt").write_text("\n".join(overrides) + "\n")
    subprocess.run(
        [
            uv,
            "pip",
            "compile",
            "in.txt",
            "--override",
            "overrides.txt",
            "--python-version",
            PY,
            "--python-platform",
            UV_PLATFORM,
            "--only-binary",
            ":all:",
            "--generate-hashes",
            "-q",
            "--no-header",
            "--annotation-style",
            "line",
            "--native-tls",
            "-o",
            "resolved.txt",
        ],
        cwd=work,
        check=True,
    )
    text = (work / "resolved.txt").read_text()
    out = {}
    for m in re.finditer(r"^(\S+)==(\S+) \\\n((?:\s+--hash=sha256:\w+(?: \\)?\n)+)\s+# via (.*)$", text, re.M):
        hashes = set(re.findall(r"sha256:(\w+)", m.group(3)))
        via = [v.strip() for v in m.group(4).split(",")]
        out[norm(m.group(1))] = (m.group(2), hashes, via)
    if "vllm" not in out:
        sys.exit(f"bundle_lock: the resolution has no vllm=={version} (see {work / 'resolved.txt'})")
    return out


def kept(resolved: dict[str, tuple[str, set[str], list[str]]]) -> list[str]:
    """vLLM and what it needs through packages the machine lacks (the machine's own needs are its own)."""
    machine = {norm(m.split("==")[0]) for m in names(DATA / "machine.txt")}
    keep: set[str] = {"vllm"}
    grew = True
    while grew:
        grew = False
        for name, (_, _, via) in resolved.items():
            if name not in keep and name not in machine and any(norm(p) in keep for p in via):
                keep.add(name)
                grew = True
    return sorted(keep)


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def pin_files(resolved, keep: list[str], work: Path) -> list[str]:
    lines = []
    for name in keep:
        version, hashes, _ = resolved[name]
        d = work / "wheels" / name  # one folder a package: the file pip chose is the one there
        d.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--no-cache-dir",
                *PIP_TARGET,
                "-d",
                str(d),
                f"{name}=={version}",
            ],
            check=True,
        )
        (wheel,) = d.iterdir()
        digest = sha256(wheel)
        if digest not in hashes:
            sys.exit(f"bundle_lock: {wheel.name} has sha256 {digest}, not one of the index's hashes")
        lines.append(f"{name}=={version} --hash=sha256:{digest}  # {wheel.name}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("version")
    ap.add_argument("--work", type=Path, help="scratch folder (default: a temporary one)")
    ap.add_argument("--uv", help="a uv binary to use instead of installing " + UV_PIN)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = (a.work or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        resolved = resolve(uv_binary(work, a.uv), a.version, work)
        keep = kept(resolved)
        lines = pin_files(resolved, keep, work)
    out = DATA / f"vllm-{a.version}.lock"
    head = [
        f"# vLLM {a.version} and the {len(lines) - 1} packages it needs that the GPU machine lacks, for",
        f"# CPython {PY} on x86-64 ({UV_PLATFORM}): maintainers/gpu/bundle_lock.py {a.version} wrote this",
        "# (each hash checked against PyPI's index); maintainers/gpu/make_bundle.sh installs exactly these.",
    ]
    out.write_text("\n".join(head + lines) + "\n")
    print(f"{out}: {len(lines)} wheels")


if __name__ == "__main__":
    main()
