"""Streaming per-channel input statistics of Linear modules: E[x], E[x²], Var[x], and norms.

Accumulated in float64 over every calibration token, never storing activations (on a GPU each
batch is reduced there in float32 first).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from gapprune.engine.observe import ObservationPoints
from gapprune.models.adapter import ModelAdapter


@dataclass
class ChannelStats:
    """Running sums for one Linear's input channels."""

    sum: torch.Tensor  # (in_features,) float64
    sum_sq: torch.Tensor  # (in_features,) float64
    count: int = 0

    @classmethod
    def zeros(cls, n: int) -> ChannelStats:
        return cls(torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64))

    def update(self, x: torch.Tensor) -> None:
        flat = x.detach().reshape(-1, x.shape[-1])  # (tokens, in)
        if flat.device.type == "cpu":
            flat = flat.double()
            self.sum += flat.sum(0)
            self.sum_sq += flat.square().sum(0)
        else:  # reduced where the activations are, in float32; two vectors cross to the host, not the tokens
            flat = flat.float()
            self.sum += flat.sum(0).double().cpu()
            self.sum_sq += flat.square().sum(0).double().cpu()
        self.count += flat.shape[0]

    @property
    def mean(self) -> torch.Tensor:
        return self.sum / max(self.count, 1)

    @property
    def mean_sq(self) -> torch.Tensor:
        return self.sum_sq / max(self.count, 1)

    @property
    def var(self) -> torch.Tensor:
        return (self.mean_sq - self.mean.square()).clamp_min(0)


@dataclass
class CalibrationStats:
    """stats[layer][role] for the roles of `ModelAdapter.stat_points` (attn_in, attn_out, mlp_in, mlp_out)."""

    stats: list[dict[str, ChannelStats]] = field(default_factory=list)

    def get(self, layer: int, role: str) -> ChannelStats:
        return self.stats[layer][role]


def stats_observers(adapter: ModelAdapter, into: CalibrationStats) -> Callable[[], ObservationPoints]:
    """For `capture_layer_inputs(observers=...)`: every statistics point's channel statistics, into `into`."""

    def points() -> ObservationPoints:
        found: ObservationPoints = []
        into.stats = []
        for layer in range(adapter.n_layers):
            per_role: dict[str, ChannelStats] = {}
            into.stats.append(per_role)
            for role, linear in adapter.stat_points(layer).items():
                per_role[role] = ChannelStats.zeros(linear.in_features)
                found.append((linear, per_role[role].update))
        return found

    return points
