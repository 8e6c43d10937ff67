"""The tool names none of its maintainers' tooling: no file under e2e/, kernels_check/, configs/, or
docs/ outside docs/maintainers/ names the GPU machines' scripts, by their old folder (scripts/gpu) or
by the repository's maintainers/ folder. What a config or a user page says about launching a GPU run
is the tool's own command; the leases' logistics are docs/maintainers/gpu-logistics.md's.
docs/reference/layout.md, the map of every folder, is the one page that draws it."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support import ROOT

SCANNED = ("e2e", "kernels_check", "configs", "docs")
# The map of the repository draws every folder, this one too (with the rule it is held to).
ALLOWED = {"docs/reference/layout.md"}
OLD = re.compile(r"scripts/gpu|[\"']scripts[\"']\s*[/,]\s*[\"']gpu[\"']")
# A path from the repository root: `maintainers/...` not preceded by a path character, so the docs'
# own links (`../maintainers/gpu-logistics.md`, `docs/maintainers/...`) are not it.
FOLDER = re.compile(r"(?<![\w./-])maintainers/([\w.-]*)|[\"']maintainers[\"']\s*[/,)]")


def mentions(text: str, maintainers: Path = ROOT / "maintainers") -> list[str]:
    """Each mention of the maintainers' tooling in a text. `maintainers/X` counts when X is in the
    repository's maintainers/ folder (or is empty: the folder itself); a docs page named like
    `maintainers/gpu-logistics.md` from docs/ is a page, not the folder."""
    out = [m.group(0) for m in OLD.finditer(text)]
    for m in FOLDER.finditer(text):
        first = m.group(1)
        if first is None or first == "" or (maintainers / first).exists():
            out.append(m.group(0))
    return out


def _scanned_files() -> list[Path]:
    files = []
    for top in SCANNED:
        for p in sorted((ROOT / top).rglob("*")):
            rel = p.relative_to(ROOT)
            if p.is_file() and "__pycache__" not in rel.parts and rel.parts[:2] != ("docs", "maintainers"):
                files.append(p)
    return files


def test_no_module_config_or_user_page_names_the_maintainers_tooling():
    files = _scanned_files()
    # Each folder is really read (a moved folder would make the check pass on nothing).
    assert {p.relative_to(ROOT).parts[0] for p in files} == set(SCANNED)
    found = {
        rel: hits
        for p in files
        if (rel := p.relative_to(ROOT).as_posix()) not in ALLOWED
        and (hits := mentions(p.read_bytes().decode("utf-8", errors="replace")))
    }
    assert found == {}


def test_the_check_sees_each_way_of_naming_it_and_passes_the_docs_links():
    named = [
        "bash scripts/gpu/build_twin.sh && python3 run_e2e.py --config x.toml",
        "see `maintainers/gpu/reference_tp1.sh stage 0`",
        "(maintainers/tests/)",
        "the folder `maintainers/`",
        'GPU = ROOT / "maintainers" / "gpu"',
        'Path("scripts", "gpu")',
    ]
    for text in named:
        assert mentions(text), text
    not_named = [
        "[maintainers' page](../maintainers/gpu-logistics.md)",
        "docs/maintainers/gpu-logistics.md",
        "the maintainers' NVML check script",
        "maintainers/gpu-logistics.md",  # a page of docs/ named from docs/index.md
        "scripts/results_index.py",
    ]
    for text in not_named:
        assert mentions(text) == [], text


def test_the_map_draws_the_maintainers_folder():
    assert "`maintainers/gpu/`" in (ROOT / "docs" / "reference" / "layout.md").read_text()
    assert (ROOT / "maintainers" / "gpu").is_dir() and not (ROOT / "scripts" / "gpu").exists()
