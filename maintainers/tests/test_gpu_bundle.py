"""The GPU bundle's tools without PyPI or a GPU: the install script's staging contract, the pruning
of a --target site, the lock's filter, and the committed lock against the machine's package list.

bundle_check.py's import walk runs on tiny packages written under tmp_path.
The install script runs for real (bash, sha256sum, python3's tarfile) on a small bundle laid out the
way maintainers/gpu/make_bundle.sh lays one out, with its site and stage folders under tmp_path.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

GPU = Path(__file__).resolve().parents[1] / "gpu"  # maintainers/gpu
sys.path.insert(0, str(GPU))
import bundle_check  # noqa: E402  (a script folder, not a package)
import bundle_lock  # noqa: E402
import bundle_prune  # noqa: E402

NAME = "vllm-9.9.9-site.tar.xz"


def _bundle(tmp_path: Path, nparts: int = 3) -> tuple[Path, dict[str, bytes]]:
    """A tiny site packed and split like make_bundle.sh does; returns (OUT, the site's files)."""
    files = {
        "vllm/__init__.py": b"__version__ = '9.9.9'\n",
        "vllm/_C.abi3.so": os.urandom(30000),
        "dep-1.0.dist-info/RECORD": b"dep/__init__.py,,\n",
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    whole = buf.getvalue()
    size = -(-len(whole) // nparts)
    parts = [whole[i * size : (i + 1) * size] for i in range(nparts)]
    out = tmp_path / "out"
    env = {
        **os.environ,
        "VER": "9.9.9",
        "NPARTS": str(nparts),
        "NAME": NAME,
        "WHOLE": hashlib.sha256(whole).hexdigest(),
        "PART_SUMS": " ".join(hashlib.sha256(p).hexdigest() for p in parts),
    }
    for i, part in enumerate(parts):
        d = out / f"p{i}"
        d.mkdir(parents=True)
        (d / f"{NAME}.part{i}").write_bytes(part)
        for t in ("gpu-install.sh", "gpu-env.sh"):
            r = subprocess.run(
                ["bash", str(GPU / "bundle_render.sh"), str(GPU / "bundle" / f"{t}.in")],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            (d / t).write_text(r.stdout)
    return out, files


def _install(carried: Path, part_dir: Path, site: Path, stage: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "GPU_SITE": str(site), "GPU_STAGE": str(stage)}
    return subprocess.run(
        ["bash", str(part_dir / "gpu-install.sh"), str(carried)], env=env, capture_output=True, text=True, timeout=60
    )


def test_install_stages_each_part_checks_it_and_installs_when_all_are_there(tmp_path):
    out, files = _bundle(tmp_path)
    site, stage, carried = tmp_path / "site", tmp_path / "stage", tmp_path / "carried"
    # The calls of a lease: each brings one part (the others are not in the checkout then).
    (carried / "p0").mkdir(parents=True)
    (carried / "p0").joinpath(f"{NAME}.part0").write_bytes((out / "p0" / f"{NAME}.part0").read_bytes())
    r = _install(carried, out / "p0", site, stage)
    assert r.returncode == 0 and "staged part 0" in r.stdout and "still missing parts: 1 2" in r.stdout
    assert not site.exists()
    # A part damaged on the way is refused when it arrives, and can be carried again.
    (carried / "p1").mkdir()
    good = (out / "p1" / f"{NAME}.part1").read_bytes()
    (carried / "p1" / f"{NAME}.part1").write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    r = _install(carried, out / "p1", site, stage)
    assert r.returncode == 1 and "part 1 is damaged" in r.stderr and not (stage / "part1").exists()
    (carried / "p1" / f"{NAME}.part1").write_bytes(good)
    (carried / "p2").mkdir()
    (carried / "p2" / f"{NAME}.part2").write_bytes((out / "p2" / f"{NAME}.part2").read_bytes())
    r = _install(carried, out / "p2", site, stage)
    assert r.returncode == 0, r.stderr
    assert "staged part 1" in r.stdout and "staged part 2" in r.stdout and ": OK" in r.stdout
    assert {str(p.relative_to(site)): p.read_bytes() for p in site.rglob("*") if p.is_file()} == {
        **files,
        ".complete": b"",
    }
    assert list(stage.iterdir()) == []  # the parts and the joined archive are gone
    r = _install(carried, out / "p2", site, stage)
    assert r.returncode == 0 and "already installed" in r.stdout
    env = subprocess.run(
        ["bash", "-c", f"source {out / 'p0' / 'gpu-env.sh'}; echo $PYTHONPATH; echo $VLLM_USE_FLASHINFER_SAMPLER"],
        env={**os.environ, "GPU_SITE": str(site), "PYTHONPATH": "/x"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert env == [f"{site}:/x", "0"]


def test_the_install_scripts_name_the_default_site_by_version(tmp_path):
    out, _ = _bundle(tmp_path, nparts=2)
    text = (out / "p1" / "gpu-install.sh").read_text()
    assert "SITE=${GPU_SITE:-/tmp/gpu-site-9.9.9}" in text and "N=2; NAME=vllm-9.9.9-site.tar.xz" in text
    assert "@" not in re.sub(r"\$\{[^}]*\}|\"\$@\"", "", text)  # every placeholder filled
    assert "/tmp/gpu-site-9.9.9" in (out / "p0" / "gpu-env.sh").read_text()


def _site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    for rel in (
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
        "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
        "vllm/vllm-rs",
        "vllm/only/gone.so",
        "bin/vllm",
        "vllm-1.0.dist-info/METADATA",
    ):
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(rel.encode())
    (site / "vllm-1.0.dist-info/RECORD").write_text(
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so,sha256=a,1\nvllm/vllm_flash_attn/_vllm_fa3_C.abi3.so,sha256=b,1\n"
        "vllm/vllm-rs,sha256=c,1\nvllm/only/gone.so,sha256=d,1\n../../bin/vllm,sha256=e,1\n"
        "vllm-1.0.dist-info/RECORD,,\n"
    )
    return site


def test_prune_removes_files_and_their_record_lines(tmp_path):
    site = _site(tmp_path)
    gone = bundle_prune.prune(
        site, ["vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/vllm-rs", "vllm/only/*", "bin/*", "?xgrammar/lib/*.a"]
    )
    assert sorted(gone) == ["bin/vllm", "vllm/only/gone.so", "vllm/vllm-rs", "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"]
    assert (site / "vllm-1.0.dist-info/RECORD").read_text() == (
        "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so,sha256=b,1\nvllm-1.0.dist-info/RECORD,,\n"
    )
    assert not (site / "vllm/only").exists() and not (site / "bin").exists()  # emptied folders too
    lines = bundle_prune.manifest(site).splitlines()
    assert [ln.split("  ")[2] for ln in lines] == [
        "vllm-1.0.dist-info/METADATA",
        "vllm-1.0.dist-info/RECORD",
        "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
    ]


def test_prune_refuses_a_pattern_that_matches_nothing(tmp_path):
    site = _site(tmp_path)
    with pytest.raises(SystemExit, match=r"pattern 'vllm/moved\.so' matches nothing"):
        bundle_prune.prune(site, ["vllm/moved.so"])
    assert (site / "vllm/vllm-rs").exists()  # nothing removed before the refusal


def test_prune_runs_as_a_script_with_the_locks_data_file_reader(tmp_path):
    """make_bundle.sh runs `python3 $HERE/bundle_prune.py` from the checkout root: it finds bundle_lock
    beside it (imported, not copied), wherever the folder stands."""
    assert bundle_prune.names is bundle_lock.names
    site = _site(tmp_path)
    (tmp_path / "prune.txt").write_text("# a comment\nvllm/vllm-rs\n?absent/*\n")
    r = subprocess.run(
        [sys.executable, str(GPU / "bundle_prune.py"), str(site), str(tmp_path / "prune.txt"), str(tmp_path / "m")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert not (site / "vllm/vllm-rs").exists() and "pruned 1 files" in r.stdout
    assert "vllm/vllm-rs" not in (tmp_path / "m").read_text()


def test_the_committed_bundle_record_names_its_script_and_lock_as_make_bundle_writes_them():
    """make_bundle.sh reports 'same bytes' only when its header line equals the committed one: the
    script's path and the first 16 hex digits of the lock's sha256 (the lock stays byte for byte)."""
    script = (GPU / "make_bundle.sh").read_text()
    rel = GPU.relative_to(GPU.parents[1]).as_posix() + "/make_bundle.sh"
    assert f'echo "## vllm $VER ({rel} $VER; lock $(sha256sum "$LOCK" | cut -c1-16))"' in script
    heads = re.findall(r"^## vllm (\S+) \((\S+) \1; lock ([0-9a-f]{16})\)$", (GPU / "bundles.sha256").read_text(), re.M)
    assert heads, "bundles.sha256 has no '## vllm VERSION (...)' header"
    for version, path, lock16 in heads:
        assert path == rel
        lock = GPU / "bundle" / f"vllm-{version}.lock"
        assert hashlib.sha256(lock.read_bytes()).hexdigest()[:16] == lock16, lock.name


def test_the_lock_keeps_what_vllm_needs_through_packages_the_machine_lacks(monkeypatch, tmp_path):
    (tmp_path / "machine.txt").write_text("torch==2.11.0\nnumpy\n")
    monkeypatch.setattr(bundle_lock, "DATA", tmp_path)
    resolved = {
        "vllm": ("1", set(), ["-r in.txt"]),
        "fastapi": ("1", set(), ["vllm"]),
        "starlette": ("1", set(), ["fastapi"]),
        "torch": ("2.11.0", set(), ["vllm"]),
        "numpy": ("2", set(), ["vllm", "fastapi"]),
        "sympy": ("1", set(), ["torch"]),
        "both": ("1", set(), ["torch", "starlette"]),
    }
    # torch's own needs (sympy) are the machine's; one that a kept package needs too (both) is kept.
    assert bundle_lock.kept(resolved) == ["both", "fastapi", "starlette", "vllm"]


def test_the_committed_lock_pins_files_and_leaves_out_the_machine_and_dropped_packages():
    machine = {bundle_lock.norm(n.split("==")[0]) for n in bundle_lock.names(GPU / "bundle" / "machine.txt")}
    dropped = {bundle_lock.norm(n) for n in bundle_lock.names(GPU / "bundle" / "drop.txt")}
    for lock in sorted((GPU / "bundle").glob("vllm-*.lock")):
        version = lock.name[len("vllm-") : -len(".lock")]
        pins = re.findall(r"^(\S+)==(\S+) --hash=sha256:([0-9a-f]{64})  # (\S+\.whl)$", lock.read_text(), re.M)
        body = [ln for ln in lock.read_text().splitlines() if ln and not ln.startswith("#")]
        assert len(pins) == len(body), f"{lock.name}: a line is not 'name==version --hash=sha256:... # file.whl'"
        names = {n for n, *_ in pins}
        assert ("vllm", version) in {(n, v) for n, v, *_ in pins}
        assert not names & machine and not names & dropped, (names & machine, names & dropped)
        assert all(f.lower().startswith(n.replace("-", "_")) for n, _, _, f in pins)


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _tiny_vllm(tmp_path: Path) -> Path:
    """The shape of 0.23.0's failure: a function imports a module whose module level imports an absent
    package under an `if`; plus imports the walk must not count (typing-only, guarded, in a function of
    a file whose functions are not followed)."""
    return _write(
        tmp_path / "site",
        {
            "vllm/__init__.py": "",
            "vllm/quant/__init__.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    import typingonly\n"
                "def get_quantization_config(name):\n"
                "    from .humming import HummingConfig\n"
                "    try:\n        import guardedpkg\n    except ImportError:\n        guardedpkg = None\n"
                "    return HummingConfig\n"
            ),
            "vllm/quant/humming.py": "import os\nif os.name:\n    from humming.dtypes import DataType\nHummingConfig = 1\n",
            "vllm/other.py": "def never_followed():\n    import notfollowed\n",
        },
    )


def _check(site: Path, in_functions=("vllm.quant",), allowed=None):
    return bundle_check.check(
        site, roots=("vllm", "vllm.other"), in_functions=in_functions, allowed=allowed or {}, required=()
    )


def test_the_checker_finds_an_absent_package_imported_through_a_function(tmp_path):
    site = _tiny_vllm(tmp_path)
    lines, bad = _check(site)
    assert bad == 1 and any(ln.startswith("MISSING import humming (in vllm.quant.humming:3)") for ln in lines), lines
    assert "vllm.quant:5 in a function" in bundle_check.walk(site, ("vllm",), ("vllm.quant",)).chain(
        "vllm.quant.humming"
    )
    assert any(ln.startswith("guarded import guardedpkg absent (in vllm.quant:7 in a function)") for ln in lines)
    assert not any("typingonly" in ln or "notfollowed" in ln for ln in lines), lines
    # Module-level imports alone (the walk before tonight's failure) do not reach it.
    lines, bad = _check(site, in_functions=())
    assert bad == 0 and not any("humming" in ln for ln in lines), lines
    # An allow-list entry turns the failure into a named, reasoned absence.
    lines, bad = _check(site, allowed={"humming": "never reached: a test"})
    assert bad == 0 and any(ln.startswith("allowed absent humming: never reached: a test") for ln in lines), lines


def test_the_checker_follows_the_imports_of_a_carried_package(tmp_path):
    site = _tiny_vllm(tmp_path)
    _write(
        site,
        {
            "humming/__init__.py": "import humming.utils\n",
            "humming/dtypes.py": "",
            "humming/utils.py": "def later():\n    import notfollowed\nfrom elftools.elf import ELFFile\n",
        },
    )
    lines, bad = _check(site)
    assert bad == 1 and any(ln.startswith("MISSING import elftools (in humming.utils:3)") for ln in lines), lines
    _write(site, {"elftools/__init__.py": "", "elftools/elf.py": ""})
    lines, bad = _check(site)
    assert bad == 0 and not any("notfollowed" in ln for ln in lines), lines
