"""How gapprune removes a unit without removing it: one definition of a unit mask.

A unit (an attention head, a KV group's heads, an MLP channel) feeds the block's output projection
through its own columns, so removing it equals zeroing those columns, or multiplying the
projection's input by 0 there (tested against physical removal). Two ways to apply that, one rule:

* `UnitMasks` writes the zeros into the weights (a plan's units, the reference profiler, refinement):
  one model, one set of masks, restored on exit;
* `scaled_inputs` multiplies the projection's input by a mask per row group, leaving the weights
  alone: each copy of a stacked replay (`option_masks`) or each sample of a batch (the Fisher
  estimate's differentiable masks) sees its own units.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Self

import torch
from torch import nn

from gapprune.models.adapter import ModelAdapter

Compensated = tuple[torch.Tensor, torch.Tensor]  # an output projection's full-width weight and bias


def unit_mask(n_units: int, kept: list[int] | None, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """(n_units,) of ones at `kept` and zeros elsewhere (None: all ones)."""
    if kept is None:
        return torch.ones(n_units, dtype=dtype, device=device)
    mask = torch.zeros(n_units, dtype=dtype, device=device)
    mask[kept] = 1
    return mask


class UnitMasks:
    """Zeroes the output-projection columns of removed units, per (layer, component).

    Setting a component again starts from its original weights, so masks never compound; `restore_`
    (or leaving the `with` block) puts every original weight back.
    """

    def __init__(self, adapter: ModelAdapter) -> None:
        self.adapter = adapter
        self._saved: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor | None]] = {}

    def set_(self, layer: int, component: str, kept: list[int] | None) -> None:
        """Keep only units `kept` of the component (None or all ids: dense)."""
        out = self.adapter.out_proj(layer, component)
        assert out is not None
        unit = self.adapter.unit_width(component)
        n_units = out.in_features // unit
        key = (layer, component)
        if key in self._saved:
            weight, bias = self._saved[key]
            out.weight.data.copy_(weight)
            if bias is not None:
                out.bias.data.copy_(bias)
        if kept is None or len(kept) == n_units:
            return
        if key not in self._saved:
            self._saved[key] = (out.weight.data.clone(), out.bias.data.clone() if out.bias is not None else None)
        mask = unit_mask(n_units, kept, dtype=out.weight.dtype, device=out.weight.device)
        out.weight.data.mul_(mask.repeat_interleave(unit))  # (hidden, in) * (in,)
        if out.bias is not None and not kept:
            out.bias.data.zero_()

    def restore_(self) -> None:
        for layer, component in list(self._saved):
            self.set_(layer, component, None)
        self._saved.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore_()


@contextlib.contextmanager
def masked_units(adapter: ModelAdapter, layer: int, component: str, kept: list[int]) -> Iterator[None]:
    """Temporarily zero the output-projection columns of every unit not in `kept`."""
    with UnitMasks(adapter) as masks:
        masks.set_(layer, component, kept)
        yield


@contextlib.contextmanager
def scaled_inputs(out: nn.Linear, scale: torch.Tensor) -> Iterator[None]:
    """While active, row group g of `out`'s input (the batch viewed as G groups) is multiplied by
    scale[g] (G, in_features): stacked copies of a batch, or the samples of one."""
    groups = scale.shape[0]

    def pre_hook(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        x = args[0]
        stacked = x.view(groups, -1, *x.shape[1:])  # (G, B/G, T, in)
        return ((stacked * scale.view(groups, 1, 1, -1).to(x.dtype)).view_as(x), *args[1:])

    handle = out.register_forward_pre_hook(pre_hook)
    try:
        yield
    finally:
        handle.remove()


@contextlib.contextmanager
def option_masks(adapter: ModelAdapter, layer: int, component: str, kept: list[list[int] | None],
                 compensated: list[Compensated | None] | None = None) -> Iterator[None]:
    """While active, copy g of the stacked batch sees the component with only units kept[g] (None: all),
    and, where compensated[g] is given, its output projection replaced by that weight and bias."""
    out = adapter.out_proj(layer, component)
    assert out is not None
    unit = adapter.unit_width(component)
    n_units = out.in_features // unit
    copies = len(kept)
    dtype, device = out.weight.dtype, out.weight.device
    with torch.autocast(device.type, enabled=False):  # CPU autocast refuses to stack float16 masks
        mask = torch.stack([unit_mask(n_units, units, dtype=dtype, device=device) for units in kept])
    emptied = torch.tensor([units is not None and not units for units in kept], device=device)

    def drop_bias(module: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        assert out.bias is not None  # registered only then
        stacked = output.view(copies, -1, *output.shape[1:])
        return (stacked - out.bias * emptied.view(copies, 1, 1, 1).to(output.dtype)).view_as(output)

    def refit_output(module: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        assert compensated is not None
        x = args[0].view(copies, -1, args[0].shape[-1])  # already masked by the pre-hook
        y = output.view(copies, -1, output.shape[-1]).clone()
        for g, refit in enumerate(compensated):
            if refit is not None:
                y[g] = x[g] @ refit[0].T + refit[1]
        return y.view_as(output)

    handles = []
    if out.bias is not None and bool(emptied.any()):
        handles.append(out.register_forward_hook(drop_bias))
    if compensated is not None and any(refit is not None for refit in compensated):
        handles.append(out.register_forward_hook(refit_output))
    try:
        with scaled_inputs(out, mask.repeat_interleave(unit, dim=1)):  # (copies, in_features)
            yield
    finally:
        for handle in handles:
            handle.remove()


def stack_kwargs(kwargs: dict[str, Any], batch: int, copies: int) -> dict[str, Any]:
    """Repeat every per-sample tensor (leading dim == batch) `copies` times; broadcast ones stay."""

    def expand(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.ndim >= 2 and value.shape[0] == batch and batch > 1:
            return value.repeat(copies, *([1] * (value.ndim - 1)))
        if isinstance(value, tuple):
            return tuple(expand(v) for v in value)
        return value

    return {k: expand(v) for k, v in kwargs.items()}
