"""A package's public names imported on first use (PEP 562), so importing the package, or a light module in it,
does not import what those names need (torch, transformers, peft)."""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Callable
from typing import Any


def lazy_names(package: str, homes: dict[str, str]) -> Callable[[str], Any]:
    """The `__getattr__` that gives `package` its names from `homes` (name -> the module defining it) on first use.

    A name may be its own submodule's too (`gapprune.prune` the function and the subpackage, `gapprune.tune.distill`
    the function and its module): importing that submodule binds its name on the package, which an eager
    `from ... import` used to overwrite afterwards. Here the package ignores such a binding, so the name stays the
    function whatever is imported first.
    """
    module = sys.modules[package]

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(homes[name]), name)
        setattr(module, name, value)  # found directly from now on
        return value

    class _Package(types.ModuleType):
        def __setattr__(self, name: str, value: Any) -> None:
            if name in homes and isinstance(value, types.ModuleType):
                return  # the import system binding a submodule of an exported name: the name keeps its value
            super().__setattr__(name, value)

    module.__class__ = _Package
    return __getattr__
