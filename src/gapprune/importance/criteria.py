"""The four criteria of DESIGN §2: magnitude, activation (Wanda-sp), fluctuation (FLAP), taylor (LLM-Pruner)."""

from __future__ import annotations

import torch

from gapprune.importance.base import CRITERIA, ScoringContext, column_energy, per_head


def _out_role(component: str) -> str:
    return "attn_out" if component == "attn" else "mlp_out"


def _reduce(values: torch.Tensor, context: ScoringContext, component: str) -> torch.Tensor:
    """Per-column values -> per-unit scores (heads sum their head_dim columns)."""
    return per_head(values, context.adapter.head_dim) if component == "attn" else values


@CRITERIA.register("magnitude")
def magnitude(context: ScoringContext, layer: int, component: str) -> torch.Tensor:
    """Sum of squared weights a unit owns (a KV head's k/v rows are shared by its query heads)."""
    adapter = context.adapter
    linears = adapter.component_weights(layer, component)
    if component == "mlp":
        gate, up, down = linears
        return (gate.weight.double().square().sum(1) + up.weight.double().square().sum(1)).cpu() + column_energy(down.weight)
    q, k, v, o = linears
    hd = adapter.head_dim
    shape = adapter.layer_shape(layer)
    n_rep = shape.n_heads // shape.n_kv_heads
    own = per_head(q.weight.double().square().sum(1).cpu(), hd) + per_head(column_energy(o.weight), hd)
    shared = per_head((k.weight.double().square().sum(1) + v.weight.double().square().sum(1)).cpu(), hd)  # (n_kv,)
    return own + shared.repeat_interleave(n_rep) / n_rep


def _needs_stats(context: ScoringContext, name: str) -> None:
    if context.stats is None:
        raise ValueError(f"criterion {name!r} needs calibration statistics")


@CRITERIA.register("activation")
def activation(context: ScoringContext, layer: int, component: str) -> torch.Tensor:
    """Σ_j ||W[:, j]||² · E[x_j²] over the unit's input columns of the output projection."""
    _needs_stats(context, "activation")
    out = context.adapter.out_proj(layer, component)
    assert out is not None and context.stats is not None
    return _reduce(column_energy(out.weight) * context.stats.get(layer, _out_role(component)).mean_sq, context, component)


@CRITERIA.register("fluctuation")
def fluctuation(context: ScoringContext, layer: int, component: str) -> torch.Tensor:
    """Σ_j ||W[:, j]||² · Var[x_j]: what a unit's output varies by (its mean can be kept as a bias)."""
    _needs_stats(context, "fluctuation")
    out = context.adapter.out_proj(layer, component)
    assert out is not None and context.stats is not None
    return _reduce(column_energy(out.weight) * context.stats.get(layer, _out_role(component)).var, context, component)


@CRITERIA.register("taylor")
def taylor(context: ScoringContext, layer: int, component: str) -> torch.Tensor:
    """|Σ w · ∂L/∂w| over all weights of the unit (first-order loss change of removing it)."""
    adapter = context.adapter
    if not context.grads:
        raise ValueError("criterion 'taylor' needs gradients; run importance.taylor.accumulate_gradients first")
    linears = adapter.component_weights(layer, component)

    def wg(linear: torch.nn.Linear) -> torch.Tensor:
        return linear.weight.detach().double() * context.grads[id(linear.weight)].double()

    if component == "mlp":
        gate, up, down = linears
        return (wg(gate).sum(1) + wg(up).sum(1) + wg(down).sum(0)).abs()
    q, k, v, o = linears
    hd = adapter.head_dim
    shape = adapter.layer_shape(layer)
    n_rep = shape.n_heads // shape.n_kv_heads
    own = per_head(wg(q).sum(1), hd) + per_head(wg(o).sum(0), hd)
    shared = per_head(wg(k).sum(1) + wg(v).sum(1), hd).repeat_interleave(n_rep) / n_rep
    return (own + shared).abs()
