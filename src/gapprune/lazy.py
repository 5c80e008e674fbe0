"""A package's public names imported on first use (PEP 562), so importing the package, or a light module in it,
does not import what those names need (torch, transformers, peft)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_names(package: str, homes: dict[str, str]) -> Callable[[str], Any]:
    """The `__getattr__` that gives `package` its names from `homes` (name -> the module defining it) on first use.

    No exported name is also a submodule's name (`gapprune.prune` is the function, its code lives in
    `gapprune.pruning`; `gapprune.tune.distill` the function, in `gapprune.tune.distillation`), so importing any
    submodule never rebinds an exported name and `import gapprune.a.b as m` always gives the module.
    """
    module = sys.modules[package]

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(homes[name]), name)
        setattr(module, name, value)  # found directly from now on
        return value

    return __getattr__
