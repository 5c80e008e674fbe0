"""The house stays a stack: no module imports a module that imports it back, and no package reaches
a package that reaches it back. Every import counts, type-only and function-local ones included:
they are dependencies of the design even when they do not run at import time."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import gapprune

SOURCE = Path(gapprune.__file__).parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SOURCE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, name: str, modules: set[str]) -> set[str]:
    """The gapprune modules `path` imports: `from a.b import c` names a.b.c when c is a module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            if not base.startswith("gapprune"):
                continue
            submodules = {f"{base}.{alias.name}" for alias in node.names} & modules
            found.update(submodules or {base} & modules)
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in SOURCE.rglob("*.py")}
    return {name: imported(path, name, set(paths)) for name, path in paths.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one member (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            members = []
            while True:
                member = stack.pop()
                members.append(member)
                if member == node:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def package_of(module: str) -> str:
    """`gapprune.profiling.auto` -> `profiling`; a top-level module is a floor of its own."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = defaultdict(set)
    for source, targets in graph.items():
        if package_of(source) == "gapprune":  # the public facade re-exports from every floor
            continue
        packages[package_of(source)].update(package_of(t) for t in targets if package_of(t) != package_of(source))
    return packages


def test_the_scan_sees_the_imports():
    graph = import_graph()
    assert len(graph) >= 60
    assert "gapprune.allocate.knapsack" in graph["gapprune.allocate.gap"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_imports_itself_back():
    assert cycles(import_graph()) == []


def test_no_package_reaches_itself_back():
    assert cycles(package_graph(import_graph())) == []


# The floors of the house, bottom first: a package may import only packages on floors below its own
# (several on one floor know nothing of each other). A new package takes the lowest floor its imports allow.
FLOORS: list[tuple[str, ...]] = [
    ("config", "values", "lazy", "components", "phases", "registry", "data", "serving", "output", "llamacpp_binding"),
    ("models",),
    ("allocate", "engine"),
    ("budget", "distributed", "calibrate"),
    ("refit", "importance"),
    ("options",),
    ("pruning",),
    ("evaluate",),
    ("export",),
    ("profiling", "budgets"),
    ("pipeline", "runtimes"),
    ("api",),
    ("tune",),
    ("cli",),
    ("__main__",),
]


def upward_imports(packages: dict[str, set[str]], floors: list[tuple[str, ...]]) -> list[str]:
    """Every import of a package on its own floor or above, and every package no floor names."""
    floor = {name: level for level, names in enumerate(floors) for name in names}
    found = [f"{p} is on no floor" for p in sorted(packages) if p not in floor]
    for source, targets in sorted(packages.items()):
        for target in sorted(targets):
            if target not in floor:
                found.append(f"{target} is on no floor")
            elif source in floor and floor[target] >= floor[source]:
                found.append(f"{source} (floor {floor[source]}) imports {target} (floor {floor[target]})")
    return found


def test_every_import_points_down_the_declared_floors():
    assert upward_imports(package_graph(import_graph()), FLOORS) == []


def test_the_direction_check_sees_an_upward_import():
    packages = package_graph(import_graph())
    packages["models"] = packages["models"] | {"profiling"}  # models reaching up into profiling
    assert upward_imports(packages, FLOORS) == ["models (floor 1) imports profiling (floor 9)"]
    packages["newpackage"] = {"models"}
    assert "newpackage is on no floor" in upward_imports(packages, FLOORS)
