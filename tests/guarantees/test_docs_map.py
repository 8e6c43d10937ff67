"""The maps stay complete: docs/reference/layout.md ("Where things live") names every module, and
neither the README nor any docs page names one that is gone; every docs page is in the site's nav and
every link between them resolves; the generated reference covers every flag and config key;
results/README.md names every committed results folder; the extras the code asks for are
pyproject.toml's; the README gives the quick unit-test command beside the full one."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from e2e import extras
from tests.support import ROOT

README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
LAYOUT = DOCS / "reference" / "layout.md"


def _docs_pages() -> dict[str, str]:
    return {p.relative_to(DOCS).as_posix(): p.read_text() for p in sorted(DOCS.rglob("*.md"))}


def _gen():
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


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


def test_the_layout_page_names_every_module():
    rows = [line for line in LAYOUT.read_text().splitlines() if line.startswith("|")]
    missing = [m for m in _modules() if not _named(m, rows)]
    assert missing == []


def _gone(text: str) -> list[str]:
    modules = [
        m
        for m in re.findall(r"\b(e2e(?:\.[a-z_]+)+)\b", text)
        if not any((ROOT / (m.replace(".", "/") + s)).exists() for s in (".py", "/__init__.py"))
        and not (ROOT / m.rsplit(".", 1)[0].replace(".", "/")).with_suffix(".py").exists()
    ]
    paths = [
        p
        for p in re.findall(r"`((?:e2e|kernels_check|tests|scripts|maintainers|configs|docs)/[\w./-]+)`", text)
        if "*" not in p and "<" not in p and not (ROOT / p).exists()
    ]
    return modules + paths


def test_the_readme_and_docs_name_no_module_that_is_gone():
    texts = {"README.md": README} | {f"docs/{k}": v for k, v in _docs_pages().items()}
    assert {name: g for name, text in texts.items() if (g := _gone(text))} == {}


def test_the_gone_check_sees_a_missing_module():
    assert _gone("see `e2e/no_such_module.py` and e2e.stats.no_such_module") == [
        "e2e.stats.no_such_module",
        "e2e/no_such_module.py",
    ]


def _nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [p for v in node.values() for p in _nav_pages(v)]
    return [p for item in node for p in _nav_pages(item)]


def test_every_docs_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    nav = _nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    assert sorted(nav) == sorted(_docs_pages())


def test_the_readme_links_resolve():
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    assert targets and [t for t in targets if not t.startswith("http") and not (ROOT / t).exists()] == []


def test_the_cli_reference_names_every_flag_of_every_subcommand():
    gen = _gen()
    page = gen.cli_page()
    flags = gen.cli_flags()
    assert {"run", "gsm8k", "report", "compare", "history", "env", "kernels", "twin", "assets"} <= set(flags)
    for command, options in flags.items():
        section = page.split(f"## `{command}`", 1)[1].split("\n## ", 1)[0]
        assert [o for o in options if o not in ("-h", "--help") and f"`{o}`" not in section] == [], command


def test_the_config_reference_names_every_key_with_its_bounds():
    gen = _gen()
    page = gen.config_page()
    keys = gen.config_keys()
    assert {"workload.depths", "stats.alpha", "arms.patches", "run.gpu_exclusive"} <= set(keys)
    assert [k for k in keys if f"`{k}`" not in page] == []
    alpha = next(line for line in page.splitlines() if line.startswith("| `stats.alpha`"))
    assert "&gt; 0" in alpha and "&lt; 0.5" in alpha and "`0.05`" in alpha


def test_the_run_folder_reference_names_every_file_kind_and_row_field():
    from e2e.rundir import formats

    page = _gen().rundir_page()
    assert [k for k in formats.VERSIONS if f"| `{k}` |" not in page] == []
    for model in (formats.RequestRow, formats.CellRow, formats.PlanEntry):
        assert [f for n, f in model.model_fields.items() if f"`{f.alias or n}`" not in page] == []


def test_every_reference_marker_is_expanded():
    gen = _gen()
    pages = _docs_pages()
    for name in gen.PAGES:
        assert any(gen.MARKER.format(name) in text for text in pages.values()), name
    assert "<!-- reference:" not in gen.expand(pages["reference/cli.md"])


def committed_results_folders(root: Path) -> list[str]:
    """The run folders git tracks under results/ (results/kernels/ holds kernels_check's run folders:
    those are named `kernels/<run>`); a git-ignored scratch run never counts."""
    out = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--", "results/"], capture_output=True, text=True, check=True
    ).stdout
    folders = set()
    for path in filter(None, out.split("\0")):
        parts = path.split("/")[1:]
        if len(parts) > 1:
            folders.add("/".join(parts[:2]) if parts[0] == "kernels" and len(parts) > 2 else parts[0])
    return sorted(folders)


def unnamed_results_folders(root: Path) -> list[str]:
    text = (root / "results" / "README.md").read_text()
    return [f for f in committed_results_folders(root) if f"`{f}/`" not in text]


def test_results_readme_names_every_committed_folder():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: which results folders are committed is git's to say")
    assert committed_results_folders(ROOT)
    assert unnamed_results_folders(ROOT) == []


def test_a_git_ignored_scratch_run_is_not_a_committed_folder(tmp_path):
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / ".gitignore").write_text("/results/*\n!/results/README.md\n")
    for f in ("results/kept/manifest.json", "results/kernels/k1/rows.jsonl", "results/scratch-demo/manifest.json"):
        (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f).write_text("{}")
    (tmp_path / "results" / "README.md").write_text("`kept/` and `kernels/k1/`\n")
    git("add", ".gitignore", "results/README.md")
    git("add", "-f", "results/kept", "results/kernels/k1")
    assert committed_results_folders(tmp_path) == ["kept", "kernels/k1"]
    assert unnamed_results_folders(tmp_path) == []
    git("add", "-f", "results/scratch-demo")  # once committed, it must be named
    assert unnamed_results_folders(tmp_path) == ["scratch-demo"]


def test_the_extras_the_code_names_are_pyprojects():
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras.EXTRAS) <= set(py)
    for extra, mods in extras.EXTRAS.items():
        declared = " ".join(py[extra]).lower().replace("-", "_")
        assert all(m.split(".")[0] in declared for m in mods), extra


def test_the_readme_gives_the_quick_unit_tests_beside_the_full_ones():
    head = README[: README.index("\n## ")]
    assert head.index("bash scripts/demo.sh") < head.index("bash scripts/test.sh")
    assert '-m "not server and not slow"' in head  # the unit loop tests/README.md names
