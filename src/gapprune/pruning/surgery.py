"""Physical removal: the units a plan does not keep leave the weight matrices (never masks)."""

from __future__ import annotations

from gapprune.models.adapter import ModelAdapter
from gapprune.pruning.plan import LayerPlan, Plan
from gapprune.pruning.validate import check_plan


def apply_plan_(adapter: ModelAdapter, plan: Plan) -> None:
    """Physically remove every unit the plan does not keep, then record the per-layer shapes."""
    check_layers(adapter, plan)
    for lp in plan.layers:
        prune_layer_(adapter, lp)
    adapter.record_shapes_()


def check_layers(adapter: ModelAdapter, plan: Plan) -> None:
    """The plan fits the model's current shapes: ids in range, unique, sorted, whole KV groups."""
    check_plan(plan, adapter.shapes())


def prune_layer_(adapter: ModelAdapter, lp: LayerPlan) -> None:
    """Physically remove the units of one layer that `lp` does not keep (shapes recorded by the caller)."""
    shape = adapter.layer_shape(lp.layer)
    if len(lp.attn.kept) != shape.n_heads:
        adapter.prune_attention_(lp.layer, lp.attn.kept)
    if len(lp.mlp.kept) != shape.intermediate:
        adapter.prune_mlp_(lp.layer, lp.mlp.kept)
