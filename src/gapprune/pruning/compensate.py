"""Training-free recovery applied after surgery: each pruned output projection re-fitted in place.

The re-fit itself (`lsq` or `bias`, checked on held-out calibration batches) is `gapprune.refit`.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

from gapprune.calibrate.gram import GramStats
from gapprune.components import COMPONENTS
from gapprune.models.adapter import ModelAdapter
from gapprune.pruning.plan import Plan
from gapprune.pruning.surgery import apply_plan_, check_layers
from gapprune.refit import COMPENSATIONS, refit, unit_columns

log = logging.getLogger(__name__)


def compensate_(adapter: ModelAdapter, layer: int, component: str, dense: torch.Tensor, cols: list[int],
                stats: GramStats, method: str, ridge: float = 1.0) -> dict[str, Any]:
    """Re-fit one pruned output projection in place; returns its summary.

    dense: the dense output-projection weight (out, n_in) before surgery; cols: the dense column ids
    the pruned projection kept, in order. A refit whose held-out error rises is not applied.
    """
    if method not in COMPENSATIONS:
        raise ValueError(f"unknown compensation {method!r}; choose from {', '.join(COMPENSATIONS)}")
    summary = new_summary(method)
    out = adapter.out_proj(layer, component)
    if method == "none" or out is None or len(cols) == dense.shape[1]:
        return summary  # nothing to do, removed entirely (nothing to fit) or nothing removed
    fit = refit(dense, cols, stats, (layer, component), method, ridge)
    if fit.better:
        out.weight.data.copy_(fit.weight)
        add_bias_(out, fit.shift)
        summary["applied"] += 1
        summary["error_reduction"].append(round(1 - fit.after / fit.before, 4) if fit.before else 0.0)
    else:
        log.info("layer %d %s: %s would raise held-out error (%.4g -> %.4g); kept original", layer, component,
                 method, fit.before, fit.after)
        summary["kept_original"] += 1
    return summary


def add_bias_(linear: nn.Linear, shift: torch.Tensor) -> None:
    """Add `shift` to the Linear's bias, creating the bias when the Linear has none."""
    if linear.bias is None:
        linear.bias = nn.Parameter(torch.zeros(linear.out_features, dtype=linear.weight.dtype, device=linear.weight.device))
    linear.bias.data.add_(shift.to(linear.bias.device))


def prune_and_compensate_(adapter: ModelAdapter, plan: Plan, method: str = "none", stats: GramStats | None = None,
                          ridge: float = 1.0) -> dict[str, Any]:
    """Apply `plan` physically, then re-fit the pruned output projections by `method` (dense-input Grams)."""
    if method not in COMPENSATIONS:
        raise ValueError(f"unknown compensation {method!r}; choose from {', '.join(COMPENSATIONS)}")
    if method == "none":
        apply_plan_(adapter, plan)
        return {"method": "none"}
    if stats is None:
        raise ValueError("compensation needs the Gram statistics of the calibration pass (gram_hooks)")
    check_layers(adapter, plan)
    summary = new_summary(method)
    for lp in plan.layers:  # a layer at a time: only its dense output projections are copied (a streamed model)
        stats.ensure(lp.layer)  # while the layer is still dense: its Grams are of the dense inputs
        for c in COMPONENTS:
            add_summary(summary, prune_component_and_compensate_(adapter, lp.layer, c, lp.component(c).kept, stats,
                                                                 method, ridge))
    adapter.record_shapes_()  # the new shapes, and the biases compensation may have added
    return summary


def new_summary(method: str) -> dict[str, Any]:
    return {"method": method, "applied": 0, "kept_original": 0, "error_reduction": []}


def add_summary(summary: dict[str, Any], part: dict[str, Any]) -> None:
    for name in ("applied", "kept_original", "error_reduction"):
        summary[name] += part[name]


def prune_component_and_compensate_(adapter: ModelAdapter, layer: int, component: str, kept_units: list[int],
                                    stats: GramStats, method: str, ridge: float = 1.0) -> dict[str, Any]:
    """Remove one component's units that `kept_units` does not list, then re-fit its output projection.

    Keeps the bookkeeping compensation needs: the dense output-projection weight from before the
    surgery and the dense input columns that survive it. Nothing removed: nothing changes.
    """
    stats.ensure(layer)  # before the surgery: lazily computed Grams replay the dense layer
    out = adapter.out_proj(layer, component)
    cols = unit_columns(adapter, component, kept_units)
    if out is None or len(cols) == out.in_features:
        return new_summary(method)
    dense = out.weight.data.clone()
    if component == "attn":
        adapter.prune_attention_(layer, kept_units)
    else:
        adapter.prune_mlp_(layer, kept_units)
    return compensate_(adapter, layer, component, dense, cols, stats, method, ridge)
