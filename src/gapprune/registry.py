"""A tiny name -> object registry that fails loudly (PEFT style).

Criteria, metrics, allocators and model families register here under the lower-case name the
CLI uses, so adding one is one decorated function or class and the CLI picks it up.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps lower-case names to objects; rejects duplicates and suggests close names."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        if name != name.lower() or not name.replace(".", "_").isidentifier():
            raise ValueError(f"{self.kind} name {name!r} must be a lower-case identifier (dots allowed: llama.cpp)")

        def decorator(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            close = difflib.get_close_matches(name, self._items, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise KeyError(
                f"unknown {self.kind} {name!r}; choose one of {', '.join(self.names())}.{hint}"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
