"""A package's public names imported on first use (PEP 562), so importing the package, or a light module in it,
does not import what those names need (torch, transformers, peft)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def names_from(package: str, homes: dict[str, str]) -> Callable[[str], Any]:
    """The package's `__getattr__`: `homes` maps each name to the module that defines it."""

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(homes[name]), name)
        setattr(sys.modules[package], name, value)  # found directly from now on
        return value

    return __getattr__
