"""The import graph of the package, read with ast (no module is imported), at two levels.

Folders: each stage is a folder of e2e/ (docs/reference/layout.md draws this tree), and the folders
stand in one order, top down, that every import follows: no circle between folders and no import
back up. A module at the top of e2e/ (errors, exits, extras, assets) is a folder of one.

    run_e2e -> cli -> run -> accuracy -> kernels_check -> report -> validation -> analysis -> profile -> gpu -> serve
            -> assets -> stats -> rundir -> design -> exits -> extras -> safety -> twin -> plugin -> errors

Faces: a stage package's `__init__.py` names in `__all__` the modules other stages may import;
an import from outside the folder reaches only those. Modules: no circle either, and only the
executors run the loop. Every import counts: at module level, inside a function (a lazy import is
still a dependency), and a module named by a string to importlib.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support import ROOT

FOLDERS = [
    "run_e2e",
    "cli",
    "run",
    "accuracy",
    "kernels_check",
    "report",
    "validation",
    "analysis",
    "profile",
    "gpu",
    "serve",
    "assets",
    "stats",
    "rundir",
    "design",
    "exits",
    "extras",
    "safety",
    "twin",
    "plugin",
    "errors",
]
STAGES = [
    "cli",
    "run",
    "report",
    "validation",
    "analysis",
    "profile",
    "gpu",
    "serve",
    "rundir",
    "design",
    "stats",
    "safety",
]

# Who may import these (besides nobody): the CLI is the top, and only the executors run the loop.
ONLY_FROM = {
    "e2e.cli": {"run_e2e"},
    "e2e.cli.entry": {"e2e.cli"},
    "e2e.cli.commands": {"e2e.cli.entry"},
    "e2e.run.session": {"e2e.cli.commands.run", "e2e.cli.commands.gsm8k"},
    "e2e.run.runner": {"e2e.run.executors", "e2e.run.executors.ray_tasks"},
    "kernels_check.cli": {"kernels_check.__main__", "e2e.cli.commands.kernels"},
}

# The one import back up: a command moved up whose old name committed files still give, its module
# keeping a `__main__` that runs the new one (the reports' `python -m e2e.stats.bookends`).
SHIMS = {("e2e.stats.bookends", "e2e.validation.conformance_bookends")}


def modules() -> dict[str, Path]:
    out = {"run_e2e": ROOT / "run_e2e.py"}
    for pkg in ("e2e", "kernels_check"):
        for p in (ROOT / pkg).rglob("*.py"):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = p
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules `name` imports, anywhere in the file."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    here = name if is_pkg else name.rpartition(".")[0]
    found: set[str] = set()

    def add(mod: str) -> None:
        while mod and mod not in known:  # `from e2e.x import y`: y may be a module or a name in e2e.x
            mod = mod.rpartition(".")[0]
        if mod:
            found.add(mod)

    uses_importlib = "import_module" in path.read_text() or "__import__" in path.read_text()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                add(a.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
        elif uses_importlib and isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in known:
            add(node.value)
    found.discard(name)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: imports(m, p, known) for m, p in mods.items()}


def folder(mod: str) -> str:
    """e2e.serve.server -> serve; e2e.errors -> errors; kernels_check.run -> kernels_check."""
    parts = mod.split(".")
    return parts[1] if parts[0] == "e2e" and len(parts) > 1 else parts[0]


def folder_graph(g: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for a, deps in g.items():
        for b in deps:
            if a != "e2e" and b != "e2e" and folder(a) != folder(b):
                out.setdefault(folder(a), set()).add(folder(b))
    return out


def face(pkg: str) -> list[str]:
    tree = ast.parse((ROOT / "e2e" / pkg / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"e2e/{pkg}/__init__.py has no __all__")


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_the_reader_sees_lazy_and_string_imports(tmp_path):
    """The graph is only as good as its reader: a lazy import and a module named by a string to
    importlib are arrows (the circle of issue 24 ran through lazy imports)."""
    g = graph()
    assert "e2e.report.write" in g["e2e.run.session"]  # `from e2e.report.write import write_report` in a function
    assert "e2e.run.executors.ray_executor" in g["e2e.run.executors"]
    # no module names a package module by string now (the subcommands were, until each had a module)
    by_name = tmp_path / "by_name.py"
    by_name.write_text('import importlib\n\n\ndef load():\n    return importlib.import_module("e2e.report.compare")\n')
    assert imports("e2e.cli.by_name", by_name, set(modules())) == {"e2e.report.compare"}


def test_every_folder_has_its_place():
    g = graph()
    assert sorted({folder(m) for m in g} - {"e2e"}) == sorted(FOLDERS)
    assert sorted(p.name for p in (ROOT / "e2e").iterdir() if (p / "__init__.py").exists()) == sorted(
        set(STAGES) | {"accuracy", "plugin", "twin"}
    )


def test_no_circle_in_the_import_graph():
    g = {a: deps - {b for x, b in SHIMS if x == a} for a, deps in graph().items()}
    assert cycles(g) == []
    assert (
        cycles(
            {f: deps for f, deps in folder_graph(g).items()} | {f: set() for f in FOLDERS if f not in folder_graph(g)}
        )
        == []
    )


def test_no_import_runs_back_up_the_folders():
    g = graph()
    up = [
        f"{a} ({folder(a)}) -> {b} ({folder(b)})"
        for a, deps in g.items()
        for b in deps
        if a != "e2e" and b != "e2e" and FOLDERS.index(folder(b)) < FOLDERS.index(folder(a)) and (a, b) not in SHIMS
    ]
    assert up == []


def test_the_vocabulary_lives_with_its_owners():
    """The design point is the design's (design/point.py) and the row types the run folder's
    (rundir/rows.py): neither stage reads its own words from the statistics, which read theirs."""
    g = graph()
    into_stats = [f"{a} -> {b}" for a, deps in g.items() for b in deps if folder(b) == "stats"]
    assert [x for x in into_stats if x.split(".")[1] in ("design", "rundir")] == []
    assert "e2e.design.point" in g["e2e.stats.verdicts"] and "e2e.rundir.rows" in g["e2e.stats.cells"]


def test_a_shim_imports_up_only_to_run_as_a_command():
    """A shim's import of the module above sits under `if __name__ == "__main__"`: importing the shim
    (as every run does) never reaches up."""
    mods = modules()
    for low, high in SHIMS:
        tree = ast.parse(mods[low].read_text())
        top = {n for node in tree.body if not isinstance(node, ast.If) for n in ast.walk(node)}
        assert not any(isinstance(n, ast.ImportFrom) and n.module == high for n in top), low
        assert high in graph()[low]


def test_other_stages_import_only_what_a_face_names():
    g = graph()
    faces = {pkg: face(pkg) for pkg in STAGES}
    behind = []
    for a, deps in g.items():
        for b in deps:
            pkg = folder(b)
            if pkg in faces and folder(a) != pkg and b != f"e2e.{pkg}":
                if b.split(".")[2] not in faces[pkg]:
                    behind.append(f"{a} -> {b} (not in e2e/{pkg}/__init__.py's __all__)")
    assert behind == []


def test_every_face_names_only_what_exists():
    for pkg in STAGES:
        for name in face(pkg):
            assert (
                (ROOT / "e2e" / pkg / f"{name}.py").exists()
                or (ROOT / "e2e" / pkg / name / "__init__.py").exists()
                or name == "main"
            ), f"e2e/{pkg}/__init__.py names {name}"


def test_the_cli_is_the_top_and_only_the_executors_run_the_loop():
    g = graph()
    wrong = [f"{a} -> {b}" for a, deps in g.items() for b in deps if b in ONLY_FROM and a not in ONLY_FROM[b]]
    assert wrong == []


def test_one_default_config():
    hits = [m for m, p in modules().items() if "DEFAULT_CONFIG =" in p.read_text()]
    assert hits == ["e2e.cli.flags"]
