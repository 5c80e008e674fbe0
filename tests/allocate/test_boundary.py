"""Allocators read numbers: nothing under allocate/ may import the model, calibration, scoring or replay code."""

from __future__ import annotations

import ast
from pathlib import Path

import gapprune.allocate

FORBIDDEN = ("gapprune.models", "gapprune.calibrate", "gapprune.importance", "gapprune.profiling", "gapprune.pruning",
             "gapprune.pipeline", "torch")


def imported_modules(path: Path) -> set[str]:
    """Absolute names of what `path` (a module of gapprune.allocate) imports, relative imports resolved."""
    package = ["gapprune", "allocate"]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            names.add(".".join([*base, *([node.module] if node.module else [])]))
    return names


def test_relative_imports_are_resolved(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from ..models import adapter\nfrom . import knapsack\nimport numpy\n")
    assert imported_modules(module) == {"gapprune.models", "gapprune.allocate", "numpy"}


def test_allocate_imports_only_numbers():
    folder = Path(gapprune.allocate.__file__).parent
    offenders = {
        f"{path.name}: {name}"
        for path in folder.glob("*.py")
        for name in imported_modules(path)
        if name.startswith(FORBIDDEN)
    }
    assert not offenders, f"allocate/ must depend on numbers only: {sorted(offenders)}"
    assert len(list(folder.glob("*.py"))) >= 6  # the scan saw the package's modules
