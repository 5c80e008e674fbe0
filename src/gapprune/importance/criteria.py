"""The four criteria of DESIGN §2: magnitude, activation (Wanda-sp), fluctuation (FLAP), taylor (LLM-Pruner)."""

from __future__ import annotations

import torch

from gapprune.importance.base import CRITERIA, ScoringContext, column_energy, per_head
from gapprune.models.adapter import Projections


def _out_role(component: str) -> str:
    return "attn_out" if component == "attn" else "mlp_out"


def _reduce(values: torch.Tensor, context: ScoringContext, component: str) -> torch.Tensor:
    """Per-column values -> per-unit scores (heads sum their head_dim columns)."""
    return per_head(values, context.adapter.head_dim) if component == "attn" else values


def _projections(context: ScoringContext, layer: int, component: str) -> Projections:
    found = context.adapter.projections(layer, component)
    if found is None:
        raise ValueError(f"layer {layer} has no {component} left to score; profile a dense model")
    return found


def _per_unit(context: ScoringContext, layer: int, component: str, unit_rows: torch.Tensor, group_rows: torch.Tensor | None,
              out_cols: torch.Tensor) -> torch.Tensor:
    """Per-unit totals from per-row values of unit-owned and KV-group-shared outputs and per-column values
    of the output projection; a KV group's shared value is split evenly over its query heads."""
    own = _reduce(unit_rows, context, component) + _reduce(out_cols, context, component)
    if group_rows is None:
        return own
    shape = context.adapter.layer_shape(layer)
    n_rep = shape.n_heads // shape.n_kv_heads
    return own + per_head(group_rows, context.adapter.head_dim).repeat_interleave(n_rep) / n_rep


@CRITERIA.register("magnitude")
def magnitude(context: ScoringContext, layer: int, component: str) -> torch.Tensor:
    """Sum of squared weights a unit owns (a KV head's k/v rows are shared by its query heads)."""
    p = _projections(context, layer, component)

    def row_energy(linears: tuple[torch.nn.Linear, ...]) -> torch.Tensor:
        return torch.stack([lin.weight.detach().double().square().sum(1).cpu() for lin in linears]).sum(0)

    rows = row_energy(p.unit_rows)
    shared = row_energy(p.group_rows) if p.group_rows else None
    return _per_unit(context, layer, component, rows, shared, column_energy(p.out.weight))


def _weighted_columns(context: ScoringContext, layer: int, component: str, criterion: str,
                      statistic: str) -> torch.Tensor:
    """Σ_j ||W[:, j]||² · s_j over the unit's input columns of the output projection, s_j a calibration
    statistic of that column's input (`mean_sq` or `var`)."""
    if context.stats is None:
        raise ValueError(f"criterion {criterion!r} needs calibration statistics")
    out = context.adapter.out_proj(layer, component)
    assert out is not None
    inputs = context.stats.get(layer, _out_role(component))
    return _reduce(column_energy(out.weight) * getattr(inputs, statistic), context, component)


@CRITERIA.register("activation")
def activation(context: ScoringContext, layer: int, component: str) -> torch.Tensor:
    """Σ_j ||W[:, j]||² · E[x_j²] over the unit's input columns of the output projection."""
    return _weighted_columns(context, layer, component, "activation", "mean_sq")


@CRITERIA.register("fluctuation")
def fluctuation(context: ScoringContext, layer: int, component: str) -> torch.Tensor:
    """Σ_j ||W[:, j]||² · Var[x_j]: what a unit's output varies by (its mean can be kept as a bias)."""
    return _weighted_columns(context, layer, component, "fluctuation", "var")


@CRITERIA.register("taylor")
def taylor(context: ScoringContext, layer: int, component: str) -> torch.Tensor:
    """|Σ w · ∂L/∂w| over all weights of the unit (first-order loss change of removing it)."""
    if not context.grads:
        raise ValueError("criterion 'taylor' needs gradients; run importance.taylor.accumulate_gradients first")
    p = _projections(context, layer, component)

    def wg(linear: torch.nn.Linear) -> torch.Tensor:
        return linear.weight.detach().double() * context.grads[id(linear.weight)].double()

    rows = torch.stack([wg(lin).sum(1) for lin in p.unit_rows]).sum(0)
    shared = torch.stack([wg(lin).sum(1) for lin in p.group_rows]).sum(0) if p.group_rows else None
    return _per_unit(context, layer, component, rows, shared, wg(p.out).sum(0)).abs()
