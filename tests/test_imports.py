"""No import cycles in verispec/: the modules form a layered graph (every import counts, also those inside
functions, which only hide a cycle from the interpreter), and so do the packages (verispec.proposers,
verispec.server, ... each taken as one node beside the top-level modules such as verispec.engine).

Edges are the modules an import statement names: `from verispec.a import b` is an edge to verispec.a.b when b
is a module, else to verispec.a. The package an imported module sits in is not an edge of its own (Python runs
a package's __init__ first, but a package importing its own submodules is not a cycle of the design).
"""

from __future__ import annotations

import ast
from pathlib import Path

import verispec

ROOT = Path(verispec.__file__).parent


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the verispec modules it imports, anywhere in its body."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from . import x, from ..a import b
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:  # `import verispec.a.b` names verispec.a.b
                    target = target.rpartition(".")[0]
                if target and target != name and target.startswith("verispec"):
                    edges.add(target)
        graph[name] = edges
    return graph


def _packages() -> set[str]:
    return {m for m, path in _modules().items() if path.name == "__init__.py" and m.count(".") == 1}


def package_of(module: str) -> str:
    """verispec.proposers.layerskip -> verispec.proposers; a top-level module (verispec.engine) stays itself."""
    head = ".".join(module.split(".")[:2])
    return head if head in _packages() else module


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph with every module of a subpackage of verispec merged into that subpackage."""
    out: dict[str, set[str]] = {}
    for module, edges in graph.items():
        unit = package_of(module)
        out.setdefault(unit, set()).update(package_of(e) for e in edges if package_of(e) != unit)
    return out


def _explain(graph: dict[str, set[str]], component: list[str], unit=lambda m: m) -> str:
    """A cycle with the module imports that make it."""
    inside = set(component)
    edges = [f"{m} -> {e}" for m in sorted(graph) for e in sorted(graph[m])
             if unit(m) in inside and unit(e) in inside and unit(m) != unit(e)]
    return " <-> ".join(component) + " (" + ", ".join(edges) + ")"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_imports_inside_functions():
    graph = import_graph()
    assert "verispec.engine" in graph["verispec"]  # a plain top-level import
    assert "verispec.cli.options" in graph["verispec.cli.generate"]
    assert "verispec.engine" in graph["verispec.cli.generate"]  # imported inside run()
    assert "verispec.models.packaged" in graph["verispec.cli"]  # inside build_parser()


def test_package_graph_merges_subpackages():
    merged = package_graph({"verispec.engine": {"verispec.proposers.base"}, "verispec.proposers.base": set(),
                            "verispec.proposers.layerskip": {"verispec.engine"}})
    assert cycles(merged) == [["verispec.engine", "verispec.proposers"]]


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_between_modules():
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles in verispec/: " + "; ".join(_explain(graph, c) for c in found)


def test_no_import_cycles_between_packages():
    graph = import_graph()
    found = cycles(package_graph(graph))
    assert not found, "import cycles between verispec's packages: " + "; ".join(
        _explain(graph, c, package_of) for c in found)
