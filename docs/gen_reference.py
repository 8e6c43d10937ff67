"""The reference pages' tables, generated from the code when the site is built, so they cannot drift:
every command-line flag from the argparse parsers, every config key from the pydantic model (type,
default, bounds, the checks that run on it, and the source comment beside it), and every file kind
and row field of a run folder from e2e/rundir/formats.py and the manifest's typed view.

mkdocs loads this file as a hook (mkdocs.yml `hooks:`): a page line `<!-- reference: NAME -->` is
replaced by the tables of PAGES[NAME]. tests/guarantees/test_docs_map.py calls the same functions.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import io
import json
import sys
import tokenize
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the checkout's e2e, whatever the venv has installed
    sys.path.insert(0, str(ROOT))

from annotated_types import Ge, Gt, Le, Lt, MaxLen, MinLen  # noqa: E402  (pydantic's own dependency)
from pydantic import BaseModel  # noqa: E402
from pydantic.fields import FieldInfo  # noqa: E402
from pydantic_core import PydanticUndefined  # noqa: E402

MARKER = "<!-- reference: {} -->"


def md(text: str) -> str:
    """Plain text safe inside a Markdown table cell."""
    out = " ".join(str(text).split())
    for a, b in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("|", "\\|"), ("*", "\\*")):
        out = out.replace(a, b)
    return out


def code(text: Any) -> str:
    return "`" + str(text).replace("|", "\\|") + "`"


def table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


# -- source comments ---------------------------------------------------------------------------------
def class_comments(module: types.ModuleType) -> dict[str, dict[str, str]]:
    """{class: {field: comment}}: the comment lines right above a field and the one at its end."""
    source = inspect.getsource(module)
    comments: dict[int, str] = {}
    full_line: set[int] = set()
    lines = source.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row = tok.start[0]
            comments[row] = tok.string.lstrip("#").strip()
            if not lines[row - 1][: tok.start[1]].strip():
                full_line.add(row)
    out: dict[str, dict[str, str]] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        fields = out.setdefault(node.name, {})
        for stmt in node.body:
            if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
                continue
            above = []
            row = stmt.lineno - 1
            while row in full_line:
                above.insert(0, comments[row])
                row -= 1
            end = stmt.end_lineno or stmt.lineno
            inline = [comments[r] for r in range(stmt.lineno, end + 1) if r in comments and r not in full_line]
            fields[stmt.target.id] = " ".join(above + inline)
    return out


def dict_comments(module: types.ModuleType, name: str) -> dict[str, str]:
    """{key: comment} for a module-level dict literal `name` whose entries carry end-of-line comments."""
    source = inspect.getsource(module)
    comments = {
        tok.start[0]: tok.string.lstrip("#").strip()
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    }
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets) and isinstance(node.value, ast.Dict):
            return {
                k.value: comments.get(k.lineno, "")
                for k in node.value.keys
                if isinstance(k, ast.Constant) and isinstance(k.value, str)
            }
    raise LookupError(f"{module.__name__}: no dict literal {name}")


# -- the CLI ---------------------------------------------------------------------------------------------
TYPE_WORDS = {"csv_ints": "comma-separated integers", "int": "integer", "float": "number", "Path": "path"}


def value_words(action: argparse.Action) -> str:
    if action.nargs == 0:
        return "switch"
    if action.choices:
        return "one of " + ", ".join(code(c) for c in action.choices)
    kind = action.type
    words = ""
    if kind is not None:
        free = dict(zip(kind.__code__.co_freevars, kind.__closure__ or ())) if hasattr(kind, "__code__") else {}
        if "what" in free:  # e2e.cli.flags.number(): the bound it checks, in words
            words = str(free["what"].cell_contents)
        else:
            words = TYPE_WORDS.get(getattr(kind, "__name__", ""), getattr(kind, "__name__", str(kind)))
    meta = action.metavar or (action.dest.upper() if action.option_strings else action.dest)
    return f"{code(meta)}" + (f": {md(words)}" if words else "")


def expanded_help(action: argparse.Action, prog: str) -> str:
    if not action.help:
        return ""
    params = dict(vars(action), prog=prog)
    if params.get("choices") is not None:
        params["choices"] = ", ".join(map(str, params["choices"]))
    return action.help % params


def default_words(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS):
        return "-"
    return code(action.default)


def parser_table(p: argparse.ArgumentParser) -> str:
    rows = []
    for a in p._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        name = ", ".join(code(s) for s in a.option_strings) if a.option_strings else code(a.dest) + " (positional)"
        rows.append([name, value_words(a), default_words(a), md(expanded_help(a, p.prog))])
    return table(["flag", "value", "default", "what"], rows)


def subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help or "" for c in action._choices_actions}
    for name, sub in action.choices.items():
        yield name, helps.get(name, ""), sub


def cli_page() -> str:
    from e2e.cli.commands import build_parser
    from kernels_check.cli import build_parser as kernels_parser

    out = []
    for name, help_text, sub in subcommands(build_parser("")):
        out.append(f"## `{name}`\n\n{md(help_text)}.\n")
        if name == "kernels":  # passed through whole to kernels_check's own parser
            sub = kernels_parser()
            out.append("Its command line is `python -m kernels_check`'s, passed through whole:\n")
        out.append(parser_table(sub) + "\n")
    return "\n".join(out)


def cli_flags() -> dict[str, list[str]]:
    """{subcommand: its option strings}, kernels' from kernels_check (for the completeness test)."""
    from e2e.cli.commands import build_parser
    from kernels_check.cli import build_parser as kernels_parser

    return {
        name: [s for a in (kernels_parser() if name == "kernels" else sub)._actions for s in a.option_strings]
        for name, _, sub in subcommands(build_parser(""))
    }


# -- pydantic models ------------------------------------------------------------------------------------
def big(n: Any) -> str:
    if isinstance(n, int) and not isinstance(n, bool) and n >= 2**16 and n & (n - 1) == 0:
        return f"{n} (2^{n.bit_length() - 1})"
    return str(n)


def bound_words(metadata: list[Any]) -> list[str]:
    out = []
    for m in metadata:
        if isinstance(m, Gt):
            out.append(f"> {big(m.gt)}")
        elif isinstance(m, Ge):
            out.append(f">= {big(m.ge)}")
        elif isinstance(m, Lt):
            out.append(f"< {big(m.lt)}")
        elif isinstance(m, Le):
            out.append(f"<= {big(m.le)}")
        elif isinstance(m, MinLen):
            out.append("not empty" if m.min_length == 1 else f"at least {m.min_length} long")
        elif isinstance(m, MaxLen):
            out.append(f"at most {m.max_length} long")
    return out


def strict_of(metadata: list[Any]) -> bool:
    return any(getattr(m, "strict", False) for m in metadata)


SCALARS = {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "none"}


def type_words(ann: Any) -> tuple[str, list[str]]:
    """(the type in words, bounds on its elements) of an annotation."""
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is typing.Annotated:
        inner, _ = type_words(args[0])
        meta = [m for a in args[1:] for m in (a.metadata if isinstance(a, FieldInfo) else [a])]
        return inner + (" (strict)" if strict_of(meta) else ""), bound_words(meta)
    if origin is typing.Literal:
        return "one of " + ", ".join(code(json.dumps(a)) for a in args), []
    if origin in (typing.Union, types.UnionType):
        kinds = [type_words(a) for a in args if a is not type(None)]
        words = " or ".join(k for k, _ in kinds)
        return (words + ", or unset" if type(None) in args else words), [b for _, bs in kinds for b in bs]
    if origin in (tuple, list):
        inner, bounds = type_words(args[0]) if args else ("value", [])
        return f"list of {inner}", [f"each {b}" for b in bounds]
    if origin is dict:
        return f"table of {type_words(args[1])[0]}", []
    if inspect.isclass(ann) and issubclass(ann, BaseModel):
        return "table", []
    if ann is Any:
        return "any", []
    return SCALARS.get(ann, getattr(ann, "__name__", str(ann))), []


def default_of(f: FieldInfo) -> str:
    if f.default is PydanticUndefined and f.default_factory is None:
        return "required"
    value = f.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(table)"
    if value is None:
        return "unset"
    if isinstance(value, tuple):
        value = list(value)
    return code(json.dumps(value))


def model_rows(model: type[BaseModel], prefix: str, comments: dict[str, dict[str, str]]) -> list[list[str]]:
    validators = model.__pydantic_decorators__.field_validators.values()
    notes = comments.get(model.__name__, {})
    rows = []
    for name, f in model.model_fields.items():
        kind, elem_bounds = type_words(f.annotation)
        if strict_of(f.metadata) and "(strict)" not in kind:
            kind += " (strict)"
        bounds = bound_words(f.metadata) + elem_bounds
        checks = [code(v.cls_var_name) for v in validators if name in v.info.fields]
        what = " ".join(x for x in (f.description or "", notes.get(name, "")) if x)
        key = f.alias or name
        rows.append(
            [
                code(prefix + key),
                md(kind),
                default_of(f),
                md("; ".join(bounds)) or "-",
                ", ".join(checks) or "-",
                md(what),
            ]
        )
    return rows


def sub_models(model: type[BaseModel]) -> Iterator[tuple[str, type[BaseModel]]]:
    """(field, model) for fields holding a model, a list of models or a table of models."""
    for name, f in model.model_fields.items():
        stack = [f.annotation]
        while stack:
            ann = stack.pop()
            if inspect.isclass(ann) and issubclass(ann, BaseModel):
                yield f.alias or name, ann
                break
            stack += list(typing.get_args(ann))


def model_section(
    title: str, model: type[BaseModel], prefix: str, comments: dict[str, dict[str, str]], level: int = 2
) -> str:
    head = ["key", "type", "default", "bounds", "checked by", "what"]
    rows = model_rows(model, prefix, comments)
    if not model.__pydantic_decorators__.field_validators:  # no "checked by" to show
        head.remove("checked by")
        rows = [r[:4] + r[5:] for r in rows]
    text = f"{'#' * level} {title}\n\n"
    if model.__doc__ and model.__doc__ is not BaseModel.__doc__:
        text += md(inspect.cleandoc(model.__doc__)) + "\n\n"
    text += table(head, rows) + "\n"
    whole = [code(v.cls_var_name) for v in model.__pydantic_decorators__.model_validators.values()]
    if whole:
        text += f"\nChecked across the table by {', '.join(whole)} (`{model.__module__}`).\n"
    return text


def config_page() -> str:
    from e2e.design import config

    comments = class_comments(config)
    out = [model_section("The top level", config.Config, "", comments)]
    for name, sub in sub_models(config.Config):
        title = f"`[[{name}]]` (each arm)" if name == "arms" else f"`[{name}]`"
        out.append(model_section(title, sub, f"{name}.", comments))
    return "\n".join(out)


def config_keys() -> list[str]:
    from e2e.design import config

    keys = list(config.Config.model_fields)
    for name, sub in sub_models(config.Config):
        keys += [f"{name}.{k}" for k in sub.model_fields]
    return keys


def rundir_models() -> list[tuple[str, type[BaseModel]]]:
    from e2e.rundir import formats

    return [
        ("`requests.jsonl`: a row (`RequestRow`)", formats.RequestRow),
        ("`cells.jsonl`: a row (`CellRow`)", formats.CellRow),
        ("A cell row's `gpu_state` (`GpuCellState`)", formats.GpuCellState),
        ("A foreign process in `gpu_state` (`GpuProcess`)", formats.GpuProcess),
        ("A cell row's `bookend` (`BookendResult`)", formats.BookendResult),
        ("`plan.json`: an entry (`PlanEntry`)", formats.PlanEntry),
    ]


def manifest_models() -> Iterator[tuple[str, type[BaseModel]]]:
    from e2e.rundir import manifest_model

    todo: list[tuple[str, type[BaseModel]]] = [("", manifest_model.Manifest)]
    while todo:
        path, model = todo.pop(0)
        yield path, model
        todo += [(f"{path}{name}.", sub) for name, sub in sub_models(model)]


def rundir_page() -> str:
    from e2e.rundir import formats, manifest_model

    notes = dict_comments(formats, "VERSIONS")
    out = ["## File kinds and their versions\n"]
    out.append(
        table(
            ["kind", "version", "files"], [[code(k), str(v), md(notes.get(k, ""))] for k, v in formats.VERSIONS.items()]
        )
        + "\n"
    )
    comments = class_comments(formats)
    for title, model in rundir_models():
        out.append(model_section(title, model, "", comments))
    comments = class_comments(manifest_model)
    out.append("## `manifest.json`: the fields its readers use\n")
    out.append(md(inspect.cleandoc(manifest_model.__doc__ or "").split("\n\n")[0]) + "\n")
    for path, model in manifest_models():
        out.append(model_section(f"`{path.rstrip('.') or 'manifest.json'}`", model, path, comments, level=3))
    return "\n".join(out)


PAGES: dict[str, Callable[[], str]] = {"cli": cli_page, "config": config_page, "run-folder": rundir_page}


def expand(markdown: str) -> str:
    for name, make in PAGES.items():
        marker = MARKER.format(name)
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown


def on_page_markdown(markdown: str, **_: Any) -> str:
    """mkdocs hook: the generated tables in place of their markers."""
    return expand(markdown)


if __name__ == "__main__":  # python docs/gen_reference.py cli|config|run-folder: print one page's tables
    print(PAGES[sys.argv[1]]())
