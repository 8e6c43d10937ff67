"""The docs read answer-first: no paragraph or list item of the site (every page in mkdocs.yml's nav
and under docs/) or the README runs over 250 words, code blocks and tables aside, and every page
opens, under its title, with a short summary of what it answers before the details."""

from __future__ import annotations

import importlib.util
import re
import types
from dataclasses import dataclass

import yaml

from tests.guarantees.test_docs_site import code_lines
from tests.support import ROOT

MAX_WORDS = 250  # about a screen at 1280 px: a longer block is a wall a reader skips
OPENING_WORDS = 120  # the summary under a page's title: 2-4 lines of prose, the answer first
ITEM = re.compile(r"^ *([-*+]|\d+\.) +")
COMMENT = re.compile(r"<!--.*?-->", re.S)  # figure markers: their text counts, the tags do not
WORD = re.compile(r"\w")

# Over-long paragraphs allowed for a while, as (page, the block's first words): none now. An entry
# that no longer matches a long block fails the test, so the list cannot outlive a split.
ALLOWED_LONG: list[tuple[str, str]] = []
# Pages allowed a long opening for a while, on the same terms (none now).
ALLOWED_OPENING: list[str] = []


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # 1-based, where the block starts
    kind: str  # "para", "item", "heading", "admonition"
    text: str

    @property
    def words(self) -> int:
        return sum(1 for w in COMMENT.sub(" ", self.text).split() if WORD.search(w))

    def head(self, n: int = 8) -> str:
        return " ".join(COMMENT.sub(" ", self.text).split()[:n])


def blocks(page: str, text: str) -> list[Block]:
    """The prose blocks of a Markdown page: paragraphs, list items (each item up to the next item or
    blank line; a continuation paragraph is its own block), headings and admonition titles. Code
    blocks (fenced or indented) and table rows are left out and end the block they interrupt."""
    code = {n for n, _ in code_lines(text)}
    fences = set()
    in_fence = None
    for n, line in enumerate(text.split("\n"), 1):  # the fence lines themselves
        m = re.match(r"^ *(```|~~~)", line)
        if m and (in_fence is None or m[1] == in_fence):
            fences.add(n)
            in_fence = None if in_fence else m[1]
    out: list[Block] = []
    cur: list[str] = []
    start, kind = 0, "para"

    def flush() -> None:
        nonlocal cur
        if cur:
            out.append(Block(page, start, kind, "\n".join(cur)))
        cur = []

    for n, line in enumerate(text.split("\n"), 1):
        stripped = line.strip()
        if n in code or n in fences or not stripped or stripped.startswith("|"):
            flush()
            continue
        if stripped.startswith("#") or stripped.startswith("!!!") or ITEM.match(line):
            flush()
            start = n
            kind = "heading" if stripped.startswith("#") else "admonition" if stripped.startswith("!!!") else "item"
            cur = [line]
            if kind == "heading":
                flush()
            continue
        if not cur:
            start, kind = n, "para"
        cur.append(line)
    flush()
    return out


def nav_pages() -> list[str]:
    """Every page of the site: the nav's and any other Markdown page under docs/."""

    def walk(node: object) -> list[str]:
        if isinstance(node, str):
            return [node] if node.endswith(".md") else []
        if isinstance(node, dict):
            return [p for v in node.values() for p in walk(v)]
        if isinstance(node, list):
            return [p for v in node for p in walk(v)]
        return []

    cfg = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    docs = ROOT / cfg.get("docs_dir", "docs")
    pages = dict.fromkeys(walk(cfg["nav"]))
    pages.update(dict.fromkeys(p.relative_to(docs).as_posix() for p in sorted(docs.rglob("*.md"))))
    return [f"docs/{p}" for p in pages]


def all_blocks() -> list[Block]:
    return [b for page in ["README.md", *nav_pages()] for b in blocks(page, (ROOT / page).read_text())]


def test_blocks_split_items_and_leave_out_code_and_tables():
    text = (
        "# Title\n\nOne two three.\nfour five\n\n    code words here\n\n- item one\n  goes on\n- item two\n\n"
        "| a | b |\n|---|---|\n\n```\nfenced words\n```\nafter <!-- fig:x -->1.5<!-- /fig --> ms\n"
    )
    got = [(b.line, b.kind, b.words) for b in blocks("p.md", text)]
    assert got == [(1, "heading", 1), (3, "para", 5), (8, "item", 4), (10, "item", 2), (18, "para", 3)]


def test_a_long_block_is_caught():
    long = "word " * (MAX_WORDS + 1)
    (b,) = [b for b in blocks("p.md", f"# T\n\n- {long}\n\n```\n{long}\n```\n") if b.words > MAX_WORDS]
    assert (b.kind, b.line) == ("item", 3)


def test_no_paragraph_or_list_item_runs_over_250_words():
    long = {(b.page, b.head()): b for b in all_blocks() if b.words > MAX_WORDS}
    allowed = set(ALLOWED_LONG)
    over = [
        f"{b.page}:{b.line}: {b.kind} of {b.words} words ({b.head()} ...)" for k, b in long.items() if k not in allowed
    ]
    stale = [f"{p}: {h!r} is no longer over {MAX_WORDS} words" for p, h in allowed - set(long)]
    assert over == [] and stale == []


def opening(page: str, text: str) -> Block | None:
    """The first prose block under the page's title (None when a heading, code or table comes first)."""
    bs = blocks(page, text)
    if not bs or bs[0].kind != "heading":
        return None
    first = bs[1] if len(bs) > 1 else None
    return first if first is not None and first.kind in ("para", "admonition") else None


def test_every_page_opens_with_a_short_summary():
    bad = []
    for page in ["README.md", *nav_pages()]:
        if page in ALLOWED_OPENING:
            continue
        b = opening(page, (ROOT / page).read_text())
        if b is None:
            bad.append(f"{page}: no paragraph under the title")
        elif b.words > OPENING_WORDS:
            bad.append(f"{page}:{b.line}: opens with {b.words} words ({b.head()} ...)")
    assert bad == []


# -- the committed figures, shown where their numbers are discussed -----------------------------------
def _hook():
    spec = importlib.util.spec_from_file_location("figures_hook", ROOT / "docs" / "figures_hook.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_figure_a_page_embeds_is_a_committed_png():
    hook = _hook()
    links = {
        (page, link): target
        for page in ["README.md", *nav_pages()]
        for link, target in hook.figure_links(ROOT / page, (ROOT / page).read_text()).items()
    }
    missing = [f"{page}: {link}" for (page, link), target in links.items() if not target.is_file()]
    assert missing == []
    shown = {t.relative_to(ROOT / "results").parts[0] for (page, _), t in links.items() if page.startswith("docs/")}
    # the pages that discuss the load, precision and release runs show their figures
    assert {"h200-load-grid", "h200-precision-tp1", "h200-reference-tp1", "history-h200-releases"} <= shown


def test_the_hook_rewrites_a_results_link_to_the_sites_copy():
    hook = _hook()
    page = types.SimpleNamespace(file=types.SimpleNamespace(src_uri="concepts/load.md"))
    config = {"docs_dir": str(ROOT / "docs")}
    grid = "![grid](../../results/h200-load-grid/ratio_vs_depth.png)"
    md = f"{grid} and ![x](other.png)\n\n    {grid}\n\n```\n{grid}\n```\n  - item\n\n  {grid}"
    out = hook.on_page_markdown(md, page, config, None)
    site = "![grid](../figures/h200-load-grid/ratio_vs_depth.png)"
    # an example in a code block stays as written; a list item's figure is rewritten
    assert out == f"{site} and ![x](other.png)\n\n    {grid}\n\n```\n{grid}\n```\n  - item\n\n  {site}"
