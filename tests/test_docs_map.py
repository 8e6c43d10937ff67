"""The maps stay complete: README's "Where things live" names every module and nothing that is
gone; results/README.md names every committed results folder; the extras the code asks for are
pyproject.toml's; README gives the quick unit-test command beside the full one."""

from __future__ import annotations

import re
import tomllib

from e2e import extras
from tests.support import ROOT

README = (ROOT / "README.md").read_text()


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 3)
    return text[start : end if end > 0 else None]


def _modules() -> list[str]:
    out = ["run_e2e.py"]
    for pkg in ("e2e", "kernels_check"):
        out += sorted(
            p.relative_to(ROOT).as_posix()
            for p in (ROOT / pkg).rglob("*.py")
            if p.name != "__init__.py" and "__pycache__" not in p.parts
        )
    return out


def _named(path: str, rows: list[str]) -> bool:
    """Named in full (`e2e/x.py`), or by file name in a row that names its folder (`e2e/plugin/`)."""
    folder, name = path.rsplit("/", 1) if "/" in path else ("", path)
    return any(
        f"`{path}`" in r
        or (folder and f"`{folder}/`" in r and re.search(rf"`{re.escape(name)}`|\b{re.escape(name)}\b", r))
        for r in rows
    )


def test_the_readme_map_names_every_module():
    rows = [line for line in _section(README, "Where things live").splitlines() if line.startswith("|")]
    missing = [m for m in _modules() if not _named(m, rows)]
    assert missing == []


def test_the_readme_names_no_module_that_is_gone():
    gone = [
        m
        for m in re.findall(r"\b(e2e(?:\.[a-z_]+)+)\b", README)
        if not any((ROOT / (m.replace(".", "/") + s)).exists() for s in (".py", "/__init__.py"))
        and not (ROOT / m.rsplit(".", 1)[0].replace(".", "/")).with_suffix(".py").exists()
    ]
    paths = [
        p
        for p in re.findall(r"`((?:e2e|kernels_check|tests|scripts|configs)/[\w./-]+)`", README)
        if "*" not in p and "<" not in p and not (ROOT / p).exists()
    ]
    assert gone == [] and paths == []


def test_results_readme_names_every_committed_folder():
    text = (ROOT / "results" / "README.md").read_text()
    # results/kernels/ only holds kernels_check's run folders: those are named
    folders = sorted(p.name for p in (ROOT / "results").iterdir() if p.is_dir() and p.name != "kernels")
    folders += sorted(f"kernels/{p.name}" for p in (ROOT / "results" / "kernels").iterdir() if p.is_dir())
    assert [f for f in folders if f"`{f}/`" not in text] == []


def test_the_extras_the_code_names_are_pyprojects():
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras.EXTRAS) <= set(py)
    for extra, mods in extras.EXTRAS.items():
        declared = " ".join(py[extra]).lower().replace("-", "_")
        assert all(m.split(".")[0] in declared for m in mods), extra


def test_the_readme_gives_the_quick_unit_tests_beside_the_full_ones():
    head = README[: README.index("## What a run does")]
    assert "bash scripts/test.sh" in head
    assert '-m "not soak and not slow and not gpu and not server"' in head
