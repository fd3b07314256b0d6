"""The package's import graph: data flows one way, so no module imports itself back.

Every import counts, those inside functions too (a lazy import is still a dependency);
only those under ``if TYPE_CHECKING:`` (type hints) do not.
"""

from __future__ import annotations

import ast
from pathlib import Path

import llmsim

ROOT = Path(llmsim.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(tree: ast.AST, modules: set[str]) -> set[str]:
    """The llmsim modules ``tree`` imports at run time (a name imported from a package is
    the submodule when there is one)."""
    found: set[str] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        if _is_type_checking(node):
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if sub in modules:
                    found.add(sub)
                elif node.module in modules:
                    found.add(node.module)
        stack.extend(ast.iter_child_nodes(node))
    return found


def import_graph() -> dict[str, set[str]]:
    """llmsim module → the llmsim modules it imports at run time."""
    paths = {_module_name(p): p for p in ROOT.rglob("*.py")}
    return {name: _imports(ast.parse(path.read_text(encoding="utf-8")), set(paths)) - {name}
            for name, path in paths.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (a package importing its own submodules excepted,
    as Python loads a package before its submodules), or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if nxt.startswith(node + "."):
                continue  # a package's __init__ importing its own submodule
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_module_imports_itself_back():
    assert _cycle(import_graph()) is None


def test_the_result_is_data_that_plots_and_files_read():
    graph = import_graph()
    assert "llmsim.result" not in graph["llmsim.plots"] | graph["llmsim.export"]
    assert "llmsim.export" not in graph["llmsim.result"] | graph["llmsim.plots"]


def test_a_cycle_is_found():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"p": {"p.x"}, "p.x": {"p"}}) is None


LAYERS = {"llmsim.specs": 0, "llmsim.workload": 1, "llmsim.costs": 2, "llmsim.engine": 3,
          "llmsim.result": 4, "llmsim.report": 5, "llmsim.plots": 5, "llmsim.export": 5,
          "llmsim.cli": 6}
"""The layers of docs/engine.md's one-way flow, lowest first: specs ← workload ← costs ←
engine ← result ← report / plots / export ← cli (``llmsim.cli_*`` too)."""


def _layer(module: str) -> int | None:
    for name, rank in LAYERS.items():
        if module == name or module.startswith((name + ".", name + "_")):
            return rank
    return None


def test_the_layers_import_downward_only():
    upward = {(a, b) for a, imported in import_graph().items() for b in imported
              if (la := _layer(a)) is not None and (lb := _layer(b)) is not None and lb > la}
    # Result.plot_timeline() imports the plotting module when called (a method may import
    # lazily: the result is data, and plots never import it back).
    assert upward == {("llmsim.result", "llmsim.plots")}
