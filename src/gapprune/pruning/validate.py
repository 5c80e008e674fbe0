"""A plan checked against the model it is for, from the config alone: before any weight loads.

A plan names the units it keeps. Ids out of range, repeated or unsorted, heads that do not fill
whole KV groups, or counts that disagree with the plan's own option would otherwise be applied
silently (a layer that keeps as many heads as it has is never sliced, whatever ids it names).
"""

from __future__ import annotations

from typing import Any

from gapprune.models.adapter import LayerShape
from gapprune.pruning.plan import ComponentPlan, Plan


def shapes_from_config(config: Any) -> list[LayerShape]:
    """Per-layer unit counts from a config: a pruned folder's `layer_shapes`, else the dense model's."""
    recorded = getattr(config, "layer_shapes", None)
    if recorded:
        return [LayerShape(s["num_attention_heads"], s["num_key_value_heads"], s["intermediate_size"]) for s in recorded]
    heads = config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    return [LayerShape(heads, kv, config.intermediate_size)] * config.num_hidden_layers


def _check_ids(where: str, kept: Any, size: int, unit: str) -> None:
    if not isinstance(kept, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in kept):
        raise ValueError(f"{where}: kept {unit} ids must be a list of integers")
    bad = [i for i in kept if not 0 <= i < size]
    if bad:
        raise ValueError(f"{where}: {unit} id {bad[0]} is out of range (the model has {size} {unit}s, ids 0-{size - 1})")
    if len(set(kept)) != len(kept):
        raise ValueError(f"{where}: a {unit} id is listed twice")
    if kept != sorted(kept):
        raise ValueError(f"{where}: kept {unit} ids must be sorted")


def _check_attention(where: str, plan: ComponentPlan, shape: LayerShape) -> None:
    _check_ids(where, plan.kept, shape.n_heads, "query head")
    if len(plan.option) != 2:
        raise ValueError(f"{where}: the option must be [KV groups, query heads per group], got {plan.option}")
    groups, per_group = plan.option
    n_rep = shape.n_heads // shape.n_kv_heads if shape.n_kv_heads else 0
    if not (0 <= groups <= shape.n_kv_heads and 0 <= per_group <= n_rep):
        raise ValueError(f"{where}: option {plan.option} exceeds the layer's {shape.n_kv_heads} KV groups of {n_rep} heads")
    if len(plan.kept) != groups * per_group:
        raise ValueError(f"{where}: keeps {len(plan.kept)} heads, its option [{groups}, {per_group}] says "
                         f"{groups * per_group}")
    per: dict[int, int] = {}
    for head in plan.kept:
        per[head // n_rep] = per.get(head // n_rep, 0) + 1
    if len(per) != groups or any(count != per_group for count in per.values()):
        raise ValueError(f"{where}: the kept heads do not fill {groups} KV groups with {per_group} heads each "
                         f"(heads of group j are j*{n_rep} ... j*{n_rep}+{n_rep - 1})")


def _check_mlp(where: str, plan: ComponentPlan, shape: LayerShape) -> None:
    _check_ids(where, plan.kept, shape.intermediate, "MLP channel")
    if len(plan.option) != 1 or plan.option[0] != len(plan.kept):
        raise ValueError(f"{where}: keeps {len(plan.kept)} channels, its option says {plan.option}")


def check_plan(plan: Plan, shapes: list[LayerShape], source: str = "the plan") -> None:
    """Raise ValueError naming the first layer and component where `plan` does not fit these shapes."""
    fix = "pass the plan.json written for this model (DIR/plan.json of its prune)"
    if len(plan.layers) != len(shapes):
        raise ValueError(f"{source} has {len(plan.layers)} layers, the model {len(shapes)}: {fix}")
    for index, (lp, shape) in enumerate(zip(plan.layers, shapes)):
        if lp.layer != index:
            raise ValueError(f"{source}: entry {index} is for layer {lp.layer}; layers must be listed in order: {fix}")
        try:
            _check_attention(f"layer {index} attention", lp.attn, shape)
            _check_mlp(f"layer {index} MLP", lp.mlp, shape)
        except ValueError as err:
            raise ValueError(f"{source}, {err}: {fix}") from None
