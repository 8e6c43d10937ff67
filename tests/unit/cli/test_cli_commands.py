"""One module per subcommand (issue 44, item 3): e2e/cli/commands/ holds each subcommand's flags and
run() in a module of its name, all in the one table the parser is built from; the library folders the
subcommands call parse no subcommand's flags (a `python -m` tool of theirs keeps its own)."""

from __future__ import annotations

from e2e.cli.commands import COMMANDS, build_parser
from e2e.cli.commands.base import Command
from tests.support import ROOT

COMMANDS_DIR = ROOT / "e2e" / "cli" / "commands"


def test_each_subcommand_is_a_module_of_its_name_in_the_one_table():
    modules = sorted(p.stem for p in COMMANDS_DIR.glob("*.py") if p.stem not in ("__init__", "base"))
    assert modules == sorted(COMMANDS)
    for name, cmd in COMMANDS.items():
        assert isinstance(cmd, Command) and cmd.name == name
        assert type(cmd).__module__ == f"e2e.cli.commands.{name}"
    sub = next(a for a in build_parser("")._actions if a.dest == "command")
    assert list(sub.choices) == list(COMMANDS)  # the parser is the table, in its order


def test_the_library_the_subcommands_call_parses_no_flags():
    library = [ROOT / "e2e" / "assets.py"] + [
        p for folder in ("report", "serve", "twin") for p in (ROOT / "e2e" / folder).rglob("*.py")
    ]
    parsing = [
        p.relative_to(ROOT).as_posix()
        for p in library
        if "argparse" in p.read_text() and 'if __name__ == "__main__"' not in p.read_text()
    ]
    assert parsing == []
