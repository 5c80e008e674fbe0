"""The criterion contract: `criterion(context, layer, component) -> scores`, one score per unit.

Scores are per *query head* for attention (a KV group's score is the sum of the heads it keeps)
and per intermediate channel for the MLP; higher means more important. Lower-scoring units go.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from gapprune.calibrate.stats import CalibrationStats
from gapprune.components import COMPONENTS
from gapprune.models.adapter import ModelAdapter
from gapprune.phases import layer_progress
from gapprune.registry import Registry
from gapprune.values import JsonValue

if TYPE_CHECKING:
    from gapprune.calibrate.gram import GramStats


@dataclass
class ScoringContext:
    """What a criterion may read: the model, input statistics, (for taylor) weight gradients and (for
    obs) the output projections' input Gram matrices."""

    adapter: ModelAdapter
    stats: CalibrationStats | None = None
    grads: dict[int, torch.Tensor] = field(default_factory=dict)  # id(weight) -> accumulated grad
    grams: GramStats | None = None


Criterion = Callable[[ScoringContext, int, str], torch.Tensor]
CRITERIA: Registry[Criterion] = Registry("criterion")


@dataclass
class UnitScores(JsonValue):
    """scores[layer][component]: (n_heads,) for attn, (intermediate,) for mlp, float64."""

    file_kind: ClassVar[str] = "unit-scores file"

    criterion: str
    scores: list[dict[str, torch.Tensor]]

    def get(self, layer: int, component: str) -> torch.Tensor:
        return self.scores[layer][component]

    def to_dict(self) -> dict[str, Any]:
        return {"criterion": self.criterion,
                "scores": [{c: [float(x) for x in v.tolist()] for c, v in per.items()} for per in self.scores]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UnitScores:
        return cls(data["criterion"], [{c: torch.tensor(v, dtype=torch.float64) for c, v in per.items()}
                                       for per in data["scores"]])



def row_blocks(weight: torch.Tensor, rows: int = 1024) -> list[torch.Tensor]:
    """A weight (out, in) as blocks of `rows` rows: float64 or elementwise temporaries stay block-sized,
    not the size of the whole matrix (a 7B MLP projection is 180 MB in float32, twice that in float64)."""
    return [weight[i : i + rows] for i in range(0, weight.shape[0], rows)]


def column_energy(weight: torch.Tensor) -> torch.Tensor:
    """||W[:, j]||² for each input column j of a Linear weight (out, in). -> (in,)"""
    total = torch.zeros(weight.shape[1], dtype=torch.float64, device=weight.device)
    for block in row_blocks(weight.detach()):
        total += block.double().square().sum(0)
    return total.cpu()  # statistics live on the CPU


def per_head(values: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Sum consecutive blocks of `head_dim` entries: (n_heads * head_dim,) -> (n_heads,)."""
    return values.view(-1, head_dim).sum(1)


def score_layer(context: ScoringContext, criterion: str, layer: int) -> dict[str, torch.Tensor]:
    """Every unit of `layer` scored with the named criterion, checked: one finite score per unit."""
    fn = CRITERIA.get(criterion)
    per = {c: fn(context, layer, c).double().cpu() for c in COMPONENTS}
    shape = context.adapter.layer_shape(layer)
    expected = {"attn": shape.n_heads, "mlp": shape.intermediate}
    for component, values in per.items():
        if values.shape != (expected[component],) or not torch.isfinite(values).all():
            raise RuntimeError(f"criterion {criterion!r} gave bad scores for layer {layer} {component}")
    return per


def score_units(context: ScoringContext, criterion: str) -> UnitScores:
    """Score every unit of every component with the named criterion (the calibration pass can also
    score each layer as it goes: `profiling/calibration.py`)."""
    adapter = context.adapter
    # obs on a billion-parameter model takes minutes (an OBS pass per 8,960-wide MLP): show the layers go by
    layers = layer_progress(range(adapter.n_layers), adapter.n_layers, adapter.layer_shape(0).intermediate,
                            f"importance ({criterion})")
    return UnitScores(criterion=criterion, scores=[score_layer(context, criterion, layer) for layer in layers])


__all__ = ["COMPONENTS", "CRITERIA", "ScoringContext", "UnitScores", "column_energy", "per_head", "score_layer", "score_units"]
