"""The docs site as a reader gets it: opened from the file system (site/index.html) with working
navigation and search, no code line hidden behind a scroll (78 columns)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml

from tests.support import ROOT

WIDTH = 78  # what a code block shows at 1280 px without a scroll bar
FENCE_OPEN = re.compile(r"^( *)(```|~~~)")
ITEM = re.compile(r"^( *)([-*+]|\d+\.) +")


def code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, text less the block's indent) of each line of a fenced or indented code block.
    An indented block opens after a blank line, 4 columns in from the list item it sits in (if any)."""
    lines, out, i = text.split("\n"), [], 0
    base, prev_blank, in_code = 0, True, False
    while i < len(lines):
        line = lines[i]
        if m := FENCE_OPEN.match(line):
            indent, fence = len(m[1]), m[2]
            i += 1
            while i < len(lines) and not re.match(rf"^ *{fence}\s*$", lines[i]):
                out.append((i + 1, lines[i][indent:]))
                i += 1
            i, prev_blank, in_code = i + 1, False, False
            continue
        if not line.strip():
            prev_blank, i = True, i + 1
            continue
        indent = len(line) - len(line.lstrip())
        if (in_code or prev_blank) and indent >= base + 4:
            in_code = True
            out.append((i + 1, line[base + 4 :]))
        else:
            in_code = False
            if item := ITEM.match(line):
                base = len(item[0])
            elif indent == 0:
                base = 0
        prev_blank, i = False, i + 1
    return out


def test_code_lines_finds_fenced_indented_and_list_blocks():
    text = "para\n\n    run --x   # c\n\n- item\n  more\n\n        in list\n\n```toml\n  a = 1\n```\n"
    assert code_lines(text) == [(3, "run --x   # c"), (8, "  in list"), (11, "  a = 1")]


def test_every_code_line_of_the_docs_fits_78_columns():
    long = [
        f"{p.relative_to(ROOT)}:{n}: {len(line)} columns"
        for p in sorted((ROOT / "docs").rglob("*.md"))
        for n, line in code_lines(p.read_text())
        if len(line) > WIDTH
    ]
    assert long == []


def test_the_site_is_built_to_open_from_the_file_system():
    cfg = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert cfg["use_directory_urls"] is False  # page.html, not page/ (a directory listing from file://)
    assert "offline" in cfg["plugins"] and "search" in cfg["plugins"]
    (shim,) = cfg["extra"]["polyfills"]  # the offline search's worker shim, served from the site itself
    assert not shim.startswith("http") and "iframe-worker" in (ROOT / "docs" / shim).read_text()
    assert cfg["theme"]["font"] is False  # no web fonts


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.remote: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for k, v in attrs:
            if k in ("href", "src") and v:
                self.links.append(v)
                if tag in ("script", "img") or (tag == "link" and dict(attrs).get("rel") == "stylesheet"):
                    if urlsplit(v).scheme:
                        self.remote.append(v)


def broken_links(site: Path) -> list[str]:
    """Every relative href/src of every page that is not a file of the site (a folder would show a
    directory listing from file://), and every script, image or stylesheet fetched from the network."""
    out = []
    for page in sorted(site.rglob("*.html")):
        if page.name == "404.html" and page.parent == site:
            continue  # a web server's not-found page (root-absolute links); no link leads to it
        p = _Links()
        p.feed(page.read_text())
        out += [f"{page.relative_to(site)}: {u} (network)" for u in p.remote]
        for u in p.links:
            parts = urlsplit(u)
            if parts.scheme or parts.netloc or not parts.path:
                continue  # another site, or an anchor on this page
            target = (page.parent / unquote(parts.path)).resolve()
            if not target.is_file():
                out.append(f"{page.relative_to(site)}: {u}")
    return out


def test_broken_links_names_a_folder_link_and_a_remote_script(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b.html").write_text("x")
    (tmp_path / "index.html").write_text(
        '<a href="b.html#x">b</a><a href="a/">a</a><a href="#top">t</a><a href="https://x.org/">x</a>'
        '<script src="https://unpkg.com/shim"></script><a href="missing.html">m</a>'
    )
    assert broken_links(tmp_path) == [
        "index.html: https://unpkg.com/shim (network)",
        "index.html: a/",
        "index.html: missing.html",
    ]


@pytest.mark.slow
def test_the_built_site_opens_from_the_file_system_with_search(tmp_path):
    """scripts/docs.sh (its own venv: mkdocs-material, set up on first use) builds the site; every page's
    links resolve to files, nothing is fetched from the network, and search reads an inlined index."""
    site = tmp_path / "site"
    subprocess.run(["bash", "scripts/docs.sh", "--site-dir", str(site)], cwd=ROOT, check=True, capture_output=True)
    assert (site / "index.html").is_file() and (site / "concepts" / "load.html").is_file()
    assert broken_links(site) == []
    index = (site / "search" / "search_index.js").read_text()
    assert index.startswith("var __index = {") and "stall check" in index
    assert 'src="../js/iframe-worker-shim.js"' in (site / "concepts" / "load.html").read_text()
    # the committed figures a page links under results/ are copied in by docs/figures_hook.py
    assert 'src="../figures/h200-load-grid/ratio_vs_depth.png"' in (site / "concepts" / "load.html").read_text()
    assert (site / "figures" / "h200-load-grid" / "ratio_vs_depth.png").is_file()


def test_the_quickstarts_console_capture_is_what_report_prints(tmp_path):
    """docs/quickstart.md's capture of the demo's answer is `report results/cpu-demo` now (on a copy:
    report writes the folder's files)."""
    run = tmp_path / "cpu-demo"
    shutil.copytree(ROOT / "results" / "cpu-demo", run)
    out = subprocess.run(
        [sys.executable, "run_e2e.py", "report", str(run)], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    page = (ROOT / "docs" / "quickstart.md").read_text()
    block = page.split("### What a run prints", 1)[1].split("\n\n")[2]
    shown = [line[4:] for line in block.split("\n")]
    assert shown[0] == "cpu-demo: 8 of 8 cells ok (each in report.md)" and len(shown) == 8
    assert [line.rstrip() for line in out.split("\n")[: len(shown)]] == shown
