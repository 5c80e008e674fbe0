"""Observers of the engine's passes (the replay of one layer itself is `capture.replay_layer`).

Statistics, Gram matrices and sequential compensation need a projection's input while layers run; they
say which module to observe and what to do with its input (`Observer`), and the engine installs the hooks,
runs the layers and removes the hooks. No code outside `engine/` calls a decoder layer or hooks a module
(`tests/profiling/test_engine_boundary.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

Observer = Callable[[torch.Tensor], None]  # called with a module's input (its first argument)
ObservationPoints = list[tuple[nn.Module, Observer]]


@contextmanager
def observing(points: ObservationPoints) -> Iterator[None]:
    """Call each observer with its module's input during the passes inside; in the order given."""

    def hook(observer: Observer) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        return lambda module, args: observer(args[0])

    handles = [module.register_forward_pre_hook(hook(observer)) for module, observer in points]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


class InputTaken(Exception):
    """Raised once a pass that stops early has its module's input: the rest of the layer is not needed."""
