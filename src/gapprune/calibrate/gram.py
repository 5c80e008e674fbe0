"""Gram matrices of the output projections' inputs, accumulated during the dense calibration pass.

Shared by the criteria that read them (obs) and the compensation that solves with them (lsq, bias),
so they live below both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

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

    def swapped(self) -> GramStats:
        """The halves exchanged: fit on the held-out batches, check on the fit ones."""
        return GramStats(fit=self.held_out, held_out=self.fit, sums={k: v[::-1] for k, v in self.sums.items()},
                         counts={k: v[::-1] for k, v in self.counts.items()}, batches=dict(self.batches))


def gram_hook(linear: nn.Linear, key: tuple[int, str], into: GramStats) -> torch.utils.hooks.RemovableHandle:
    """Accumulate the Gram matrix of `linear`'s input under `key`: even batches fit, odd ones hold out."""
    n = linear.in_features
    into.fit[key] = torch.zeros(n, n)
    into.held_out[key] = torch.zeros(n, n)
    into.sums[key] = [torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)]
    into.counts[key], into.batches[key] = [0, 0], 0

    def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
        x = args[0].detach().reshape(-1, args[0].shape[-1]).float().cpu()  # (tokens, n_in)
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
