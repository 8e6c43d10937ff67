"""What each result word means: one table for the latency verdicts (decided by e2e/stats/verdicts.py,
also the change points of `history`) and for the gsm8k sign-off (e2e/stats/signoff.py). Every renderer
reads it: the rule text of report.md, the colours of the console and the figures, whether a word
is a regression, and the exit status it gives (e2e/exits.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from e2e import exits
from e2e.stats.verdicts import (
    EQUIVALENT,
    FASTER,
    INCONCLUSIVE,
    INERT,
    INSUFFICIENT_REPLICATION,
    NODATA,
    NOT_MEASURED_KV,
    SLOWER,
)


@dataclass(frozen=True)
class Word:
    word: str
    meaning: str  # the rule, as report.md states it
    decided: bool  # a decision was drawn (False: the design could not decide)
    regression: bool  # compare/history: B is worse than A
    colour: str  # console and figures (hex, which rich and matplotlib both read)
    exit_status: int  # what the word alone makes of compare / history / gsm8k


LATENCY: dict[str, Word] = {
    w.word: w
    for w in (
        Word(
            SLOWER,
            "Holm-adjusted p < alpha and \\|ratio - 1\\| >= min effect, ratio > 1",
            True,
            True,
            "#d62728",
            exits.FAILED,
        ),
        Word(
            FASTER,
            "Holm-adjusted p < alpha and \\|ratio - 1\\| >= min effect, ratio < 1",
            True,
            False,
            "#2ca02c",
            exits.OK,
        ),
        Word(
            EQUIVALENT,
            "Holm-adjusted TOST p < alpha (the 90 % interval inside +-min effect)",
            True,
            False,
            "#1f77b4",
            exits.OK,
        ),
        Word(
            INCONCLUSIVE,
            'neither (not "no change": the MDE says what the design could resolve)',
            False,
            False,
            "#7f7f7f",
            exits.CANNOT_DECIDE,  # a gate that cannot tell never passes (compare's --allow-inconclusive)
        ),
        Word(
            INSUFFICIENT_REPLICATION,
            "fewer than 2 servers in an arm (nothing is decided)",
            False,
            False,
            "#bcbd22",
            exits.CANNOT_DECIDE,
        ),
        Word(
            NODATA,
            "no estimate in an arm (its cells failed, or a check refused their rounds: the warnings say which)",
            False,
            False,
            "#8c564b",
            exits.CANNOT_DECIDE,
        ),
        Word(
            NOT_MEASURED_KV,
            "the server's KV cache cannot hold c requests of this depth, so the point was skipped (nothing refused)",
            False,
            False,
            "#c7c7c7",
            exits.CANNOT_DECIDE,
        ),
        Word(
            INERT,
            "the arm's patched function was never called at this point, or never answered differently "
            "from vLLM's own: the arm ran the reference's code, so its ratio is an A/A (never equivalent)",
            False,
            False,
            "#e377c2",
            exits.CANNOT_DECIDE,
        ),
    )
}

# The sign-off's words, as e2e/stats/signoff.py spells them.
PASS, FAIL, SIGNOFF_INCONCLUSIVE, INCOMPLETE = "pass", "fail", "inconclusive", "incomplete"
SIGNOFF: dict[str, Word] = {
    w.word: w
    for w in (
        Word(
            PASS,
            "the one-sided upper bound of the paired accuracy drop is at most the margin",
            True,
            False,
            "#2ca02c",
            exits.OK,
        ),
        Word(FAIL, "the lower bound of the drop is above the margin", True, True, "#d62728", exits.FAILED),
        Word(
            SIGNOFF_INCONCLUSIVE,
            "neither (failing to reject is never a pass)",
            False,
            False,
            "#7f7f7f",
            exits.CANNOT_DECIDE,
        ),
        Word(
            INCOMPLETE,
            "a server or lm-eval failed: a comparison lacks a result",
            False,
            False,
            "#ff7f0e",
            exits.CANNOT_DECIDE,
        ),
    )
}


def latency(word: str | None) -> Word | None:
    return LATENCY.get(word or "")


def signoff(word: str | None) -> Word | None:
    return SIGNOFF.get(word or "")


STANDARD = (SLOWER, EQUIVALENT, INCONCLUSIVE, INSUFFICIENT_REPLICATION)  # every legend defines these


def rule_text(used: Iterable[str | None] = ()) -> str:
    """The decision rule in one paragraph (slower and faster share a line): the standard words and
    every other word in `used` (a table's decisions), so a legend defines each word its table shows."""
    seen = set(used)
    parts = []
    for w in (w for w in LATENCY if w != FASTER and (w in STANDARD or w in seen)):
        head = "**slower** / **faster**" if w == SLOWER else f"**{w}**"
        meaning = LATENCY[w].meaning.replace(", ratio > 1", "") if w == SLOWER else LATENCY[w].meaning
        parts.append(f"{head}: {meaning}")
    return "; ".join(parts) + "."


def status_of(words: Iterable[str | None], table: dict[str, Word] = LATENCY, inconclusive_ok: bool = False) -> int:
    """The exit status of a set of result words: a regression (1) over cannot decide (3) over 0.
    A word the table does not know cannot decide. inconclusive_ok: an inconclusive latency word
    counts as done (compare's and history's --allow-inconclusive)."""
    return exits.worst(
        exits.OK
        if inconclusive_ok and table is LATENCY and w == INCONCLUSIVE
        else table[w].exit_status
        if w in table
        else exits.CANNOT_DECIDE
        for w in words
    )


def run_status(failed_cells: bool, signoff_word: str | None, inert: bool = False) -> int:
    """A run's exit status: 1 failed cells or a failed sign-off, 3 a sign-off that could not decide
    or an inert arm (the run cannot say what the patch does), else 0. Latency verdicts do not set
    it: `compare` turns them into a regression status."""
    parts = [exits.FAILED if failed_cells else exits.OK, exits.CANNOT_DECIDE if inert else exits.OK]
    if signoff_word is not None:
        parts.append(status_of([signoff_word], SIGNOFF))
    return exits.worst(parts)
