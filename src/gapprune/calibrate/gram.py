"""Gram matrices of the output projections' inputs, one layer at a time.

Shared by the criteria that read them (obs) and the compensation that solves with them (lsq, bias),
so they live below both. An MLP Gram is intermediate² floats: for every layer at once that is
28 × 8,960² × 4 B × 2 halves = 18 GB on Qwen2.5-1.5B, more than its weights. `LayerGrams`
therefore holds one layer's Grams: asked for layer l, it replays the dense layer l from the cached
layer inputs (same batches, same order, so the same sums as hooks on the calibration pass) and
drops the previous layer's. Readers call `ensure(layer)` before they read a layer's entries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from gapprune.calibrate.capture import LayerInputs, move_kwargs, run_layer
from gapprune.models.adapter import COMPONENTS, ModelAdapter


@dataclass
class GramStats:
    """Per (layer, component): Gram matrices of the output projection's input on two halves of the
    calibration batches (fit, held out), and the input mean for `bias`."""

    fit: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)  # (n_in, n_in) float32
    held_out: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)
    sums: dict[tuple[int, str], list[torch.Tensor]] = field(default_factory=dict)  # [fit, held out] (n_in,) float64
    counts: dict[tuple[int, str], list[int]] = field(default_factory=dict)  # [fit, held out] tokens
    batches: dict[tuple[int, str], int] = field(default_factory=dict)

    def fit_mean(self, key: tuple[int, str]) -> torch.Tensor:
        return self.sums[key][0] / max(self.counts[key][0], 1)

    def ensure(self, layer: int) -> None:
        """Make `layer`'s entries readable (all are, here: they were accumulated by hooks)."""

    def swapped(self) -> GramStats:
        """The halves exchanged: fit on the held-out batches, check on the fit ones."""
        return GramStats(fit=self.held_out, held_out=self.fit, sums={k: v[::-1] for k, v in self.sums.items()},
                         counts={k: v[::-1] for k, v in self.counts.items()}, batches=dict(self.batches))

    def to_cpu_(self) -> None:
        """Move accumulated matrices to the CPU, where the solves run (in place: views share the dicts)."""
        for table in (self.fit, self.held_out):
            for key, value in table.items():
                table[key] = value.cpu()
        for key, sums in self.sums.items():
            self.sums[key] = [t.cpu() for t in sums]

    def n_matrices(self) -> int:
        """Gram matrices held now (both halves counted): what a memory test watches."""
        return len(self.fit) + len(self.held_out)


class LayerGrams(GramStats):
    """The Grams of the dense model's output projections, computed for one layer when asked and
    dropped when another layer is asked for (see the module docstring).

    The model must still be dense in `layer` when `ensure(layer)` first runs for it: callers that
    prune ask before the surgery (`prune_and_compensate_`). `swapped()` is a view with the halves
    exchanged that shares the one cached layer.
    """

    def __init__(self, adapter: ModelAdapter, inputs: LayerInputs, source: LayerGrams | None = None) -> None:
        super().__init__()
        self.adapter, self.inputs, self.source = adapter, inputs, source
        self.layer: int | None = None
        self.replays = 0  # layers replayed so far (each costs one pass of that layer over the calibration set)

    def ensure(self, layer: int) -> None:
        if self.source is not None:  # a swapped view: refresh from the shared cache
            self.source.ensure(layer)
            src = self.source
            self.fit, self.held_out, self.layer = src.held_out, src.fit, src.layer
            self.sums = {k: v[::-1] for k, v in src.sums.items()}
            self.counts = {k: v[::-1] for k, v in src.counts.items()}
            self.batches = dict(src.batches)
            return
        if self.layer == layer:
            return
        self.release()
        block = self.adapter.layers[layer]  # a streamed model loads the layer here
        param = next(block.parameters())
        handles = [gram_hook(out, (layer, c), self) for c in COMPONENTS
                   if (out := self.adapter.out_proj(layer, c)) is not None]
        try:
            with torch.inference_mode():
                for b, hidden in enumerate(self.inputs.hidden[layer]):
                    run_layer(block, hidden.to(param.device, param.dtype),
                              move_kwargs(self.inputs.kwargs[layer][b], param.device))
        finally:
            for handle in handles:
                handle.remove()
        self.to_cpu_()
        self.layer = layer
        self.replays += 1

    def release(self) -> None:
        """Drop the cached layer's matrices (in place: swapped views share these dicts)."""
        for table in (self.fit, self.held_out, self.sums, self.counts, self.batches):
            table.clear()
        self.layer = None

    def swapped(self) -> GramStats:
        return LayerGrams(self.adapter, self.inputs, source=self)


def gram_hook(linear: nn.Linear, key: tuple[int, str], into: GramStats) -> torch.utils.hooks.RemovableHandle:
    """Accumulate the Gram matrix of `linear`'s input under `key`: even batches fit, odd ones hold out."""
    n = linear.in_features
    into.fit[key] = torch.zeros(n, n)
    into.held_out[key] = torch.zeros(n, n)
    into.sums[key] = [torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)]
    into.counts[key], into.batches[key] = [0, 0], 0

    def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
        x = args[0].detach().reshape(-1, args[0].shape[-1]).float()  # (tokens, n_in), float32 on the layer's device
        if into.fit[key].device != x.device:  # accumulate where the activations are (a GPU); `to_cpu_` after
            into.fit[key], into.held_out[key] = into.fit[key].to(x.device), into.held_out[key].to(x.device)
            into.sums[key] = [t.to(x.device) for t in into.sums[key]]
        half = into.batches[key] % 2
        (into.held_out if half else into.fit)[key] += x.T @ x
        into.sums[key][half] += x.double().sum(0)
        into.counts[key][half] += x.shape[0]
        into.batches[key] += 1

    return linear.register_forward_pre_hook(hook)


def gram_hooks(adapter: ModelAdapter, into: GramStats) -> Callable[[], list[torch.utils.hooks.RemovableHandle]]:
    """Hook installer for `capture_layer_inputs(extra_hooks=...)`: every output projection's input Gram."""

    def install() -> list[torch.utils.hooks.RemovableHandle]:
        handles = []
        for layer in range(adapter.n_layers):
            for component in COMPONENTS:
                out = adapter.out_proj(layer, component)
                if out is not None:
                    handles.append(gram_hook(out, (layer, component), into))
        return handles

    return install
