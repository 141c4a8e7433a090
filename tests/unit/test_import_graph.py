"""The project's import graph: no module imports itself back through others (no circles),
and every import points down the layers configs -> parallel -> input_pipeline -> mlperf
-> launch (a lower layer never imports a higher one).

The graph is read from the source (ast), so it needs nothing imported: every `import x`
and `from x import y` anywhere in a module (inside functions too: a deferred import is
still a dependency), those under `if TYPE_CHECKING:` too: a circle of type-only imports
still ties the modules together (neither reads without the other) and becomes a real
one the day the type is used at run time.

    python tests/unit/test_import_graph.py   # prints the circles and upward imports, if any
"""

from __future__ import annotations

import ast
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAYERS = ("configs", "parallel", "input_pipeline", "mlperf", "launch")
# Upward imports allowed (none: every library lives below launch/).
KNOWN_UPWARD: set[str] = set()


def project_modules(repo: str = REPO) -> dict[str, str]:
    """Dotted module name -> file path of every module in the layered packages."""
    modules = {}
    for package in LAYERS:
        for root, _, files in os.walk(os.path.join(repo, package)):
            for name in files:
                if name.endswith(".py"):
                    path = os.path.join(root, name)
                    dotted = os.path.relpath(path, repo)[: -len(".py")].replace(os.sep, ".")
                    modules[dotted.removesuffix(".__init__")] = path
    return modules


def imports_of(module: str, path: str, modules: dict[str, str]) -> set[str]:
    """The project modules that `module` imports."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from .x import y
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            # `from a import b` imports the module a.b when there is one, else a's name b.
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        else:
            continue
        out.update(n for n in names if n in modules and n != module)
    return out


def import_graph(repo: str = REPO) -> dict[str, set[str]]:
    modules = project_modules(repo)
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """`a -> b` for every import of a higher layer by a lower one."""
    rank = {name: i for i, name in enumerate(LAYERS)}
    return sorted(
        f"{a} -> {b}"
        for a, targets in graph.items()
        for b in targets
        if rank[b.split(".")[0]] > rank[a.split(".")[0]]
    )


def test_the_graph_sees_ordinary_and_deferred_imports():
    graph = import_graph()
    assert "mlperf.task" in graph["mlperf.trainer"]  # from mlperf.task import Phase, Task
    assert "parallel.mesh" in graph["mlperf.trainer"]
    assert "mlperf.loop" in graph["mlperf.train"]
    assert "mlperf.train" in graph["launch.train"]  # inside a function
    assert "mlperf.trainer" in graph["mlperf.loop"]


def test_type_checking_imports_count(tmp_path):
    (tmp_path / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from b import Thing\n"
    )
    (tmp_path / "b.py").write_text("import a\n")
    modules = {"a": str(tmp_path / "a.py"), "b": str(tmp_path / "b.py")}
    graph = {m: imports_of(m, path, modules) for m, path in modules.items()}
    assert graph == {"a": {"b"}, "b": {"a"}}
    assert circles(graph) == [["a", "b"]]


def test_no_import_circles():
    found = circles(import_graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_imports_point_down_the_layers():
    up = [edge for edge in upward_imports(import_graph()) if edge not in KNOWN_UPWARD]
    assert not up, "imports of a higher layer:\n" + "\n".join(up)


def test_circles_are_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


if __name__ == "__main__":
    g = import_graph()
    for c in circles(g):
        print("circle:", " <-> ".join(c))
    for edge in upward_imports(g):
        print("upward:", edge)
