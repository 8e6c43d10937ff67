"""The committed runs' figures on the site, without a second copy in docs/.

A page embeds a run's PNG by its path in the repository, relative to the page, so the same Markdown
renders on GitHub too:

    ![ROCM_ATTN / FA3 per depth](../../results/h200-load-tp1/ratio_vs_depth.png)

mkdocs loads this file as a hook (mkdocs.yml `hooks:`): each PNG under results/ that a page links is
added to the site as figures/<path under results/> at build time, and the page's link is rewritten
to it, so `mkdocs build --strict` checks it like any other link. Only linked figures are copied (a
scratch run's PNG under results/ never reaches the site). tests/guarantees/test_docs_prose.py calls `figure_links`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
SITE_DIR = "figures"  # where the figures land in the site
LINK = re.compile(r"(!\[[^\]]*\]\()([^)\s]+\.png)(\))")


FENCE = re.compile(r"^ *(```|~~~)")


def prose_lines(text: str) -> list[tuple[bool, str]]:
    """(is prose, line) for each line: a fenced block, or a block indented 4 spaces after a blank line,
    is code, where a link is an example and stays as written."""
    out, fence, prev_blank, in_code = [], None, True, False
    for line in text.split("\n"):
        m = FENCE.match(line)
        if fence or m:
            if m and (fence is None or m[1] == fence):
                fence = None if fence else m[1]
            out.append((False, line))
            continue
        blank = not line.strip()
        indented = len(line) - len(line.lstrip(" ")) >= 4
        in_code = not blank and indented and (prev_blank or in_code)
        out.append((not in_code, line))
        prev_blank = blank
    return out


def figure_links(page_src: Path, text: str) -> dict[str, Path]:
    """{link as written: the results/ file it names} for each PNG link of a page's prose that leads under
    results/."""
    out = {}
    for prose, line in prose_lines(text):
        for m in LINK.finditer(line) if prose else ():
            target = (page_src.parent / m[2]).resolve()
            if target.is_relative_to(RESULTS):
                out[m[2]] = target
    return out


def _site_uri(target: Path) -> str:
    return f"{SITE_DIR}/{target.relative_to(RESULTS).as_posix()}"


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    docs = Path(config["docs_dir"])
    added: set[str] = set()
    for page in list(files.documentation_pages()):
        src = docs / page.src_uri
        for target in figure_links(src, src.read_text(encoding="utf-8")).values():
            uri = _site_uri(target)
            if uri not in added and target.is_file():  # a missing file stays a broken link: --strict names it
                files.append(File.generated(config, uri, abs_src_path=str(target)))
                added.add(uri)
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    src = Path(config["docs_dir"]) / page.file.src_uri
    links = figure_links(src, markdown)

    def swap(m: re.Match[str]) -> str:
        if m[2] not in links:
            return m[0]
        rel = os.path.relpath(_site_uri(links[m[2]]), os.path.dirname(page.file.src_uri) or ".")
        return f"{m[1]}{Path(rel).as_posix()}{m[3]}"

    return "\n".join(LINK.sub(swap, line) if prose else line for prose, line in prose_lines(markdown))
