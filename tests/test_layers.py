"""The import graph of the package, read with ast (no module is imported): no circle, and no import
running back up the layers. Every import counts: at module level, inside a function (a lazy import
is still a dependency), and a module named by a string to importlib (the subcommand table).

The layers, top down (README "Where things live" says the same in words):

    entry      run_e2e.py, e2e/cli.py, python -m kernels_check        argv -> exit status
    commands   e2e/commands.py, kernels_check/cli.py                  flags -> a call
    life       e2e/session.py, kernels_check/run.py                   a run folder's life
    steps      the sign-off, the executors and the run loop, and the other subcommands' bodies
    output     summary model, report, figures, compare, history       rendering
    analysis   rows -> statistics and result words                    pure numbers
    base       run folder, rows, config, servers, plugin, formats     what everything stands on
"""
from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

from tests.support import ROOT

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("entry", ("run_e2e", "e2e.cli", "kernels_check.__main__")),
    ("commands", ("e2e.commands", "kernels_check.cli")),
    ("life", ("e2e.session", "kernels_check.run")),
    ("steps", ("e2e.accuracy", "e2e.accuracy.*", "e2e.executors", "e2e.executors.*", "e2e.runner", "e2e.envs",
               "e2e.bench_overhead", "e2e.conformance",
               "kernels_check", "kernels_check.*")),
    ("output", ("e2e.summary", "e2e.report", "e2e.report_md", "e2e.figures", "e2e.compare", "e2e.history",
                "e2e.report_gpu")),
    ("analysis", ("e2e.analysis", "e2e.verdicts", "e2e.variance_model", "e2e.planning", "e2e.adaptive",
                  "e2e.prior", "e2e.changepoints", "e2e.bookends", "e2e.stats", "e2e.estimate", "e2e.roofline", "e2e.outcomes",
                  "e2e.signoff")),
    ("base", ("e2e", "e2e.*")),
]

# Who may import these (besides nobody): the CLI is the top, and only the executors run the loop.
ONLY_FROM = {
    "e2e.cli": {"run_e2e"},
    "e2e.commands": {"e2e.cli"},
    "e2e.session": {"e2e.commands"},
    "e2e.runner": {"e2e.executors", "e2e.executors.ray_tasks"},
    "kernels_check.cli": {"kernels_check.__main__", "e2e.commands"},
}


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
        elif uses_importlib and isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and node.value in known:
            add(node.value)
    found.discard(name)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: imports(m, p, known) for m, p in mods.items()}


def layer_of(mod: str) -> int:
    for i, (_, patterns) in enumerate(LAYERS):
        if any(fnmatch.fnmatchcase(mod, p) for p in patterns):
            return i
    raise AssertionError(f"{mod} is in no layer")


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


def test_the_reader_sees_lazy_and_string_imports():
    """The graph is only as good as its reader: a lazy import and the subcommand table's module
    strings are arrows (the circle of issue 24 ran through lazy imports)."""
    g = graph()
    assert "e2e.report" in g["e2e.session"]          # `from e2e.report import write_report` in a function
    assert "e2e.compare" in g["e2e.commands"]        # Delegate("compare", ..., "e2e.compare", ...)
    assert "e2e.executors.ray_executor" in g["e2e.executors"]


def test_no_circle_in_the_import_graph():
    assert cycles(graph()) == []


def test_no_import_runs_back_up_the_layers():
    g = graph()
    up = [f"{a} ({LAYERS[layer_of(a)][0]}) -> {b} ({LAYERS[layer_of(b)][0]})"
          for a, deps in g.items() for b in deps if layer_of(b) < layer_of(a)]
    assert up == []


def test_the_cli_is_the_top_and_only_the_executors_run_the_loop():
    g = graph()
    wrong = [f"{a} -> {b}" for a, deps in g.items() for b in deps
             if b in ONLY_FROM and a not in ONLY_FROM[b]]
    assert wrong == []


def test_one_default_config():
    hits = [m for m, p in modules().items() if "DEFAULT_CONFIG =" in p.read_text()]
    assert hits == ["e2e.commands"]


def test_every_module_is_in_a_layer_and_the_layers_are_not_stale():
    mods = set(modules())
    for m in mods:
        layer_of(m)
    for _, patterns in LAYERS:
        for p in patterns:
            assert any(fnmatch.fnmatchcase(m, p) for m in mods) or p.endswith("__main__"), f"no module matches {p}"
