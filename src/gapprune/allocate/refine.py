"""Refinement beyond the additive model (DESIGN §4, `--refine N`).

The DP assumes ΔL adds up over components. After solving, re-profile every component *given all
the others pruned by the current plan* (its conditional ΔL), re-solve on that table, and measure
each plan's true loss (all components pruned at once). Keep the plan with the lowest true loss.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from gapprune.allocate.base import Allocation, AllocationContext
from gapprune.allocate.gap import gap_allocator
from gapprune.calibrate.capture import LayerInputs, capture_layer_inputs
from gapprune.importance.base import UnitScores
from gapprune.models.adapter import COMPONENTS, ModelAdapter
from gapprune.profiling.loss_table import (
    LossTable,
    UnitMasks,
    dense_reference,
    measured_options,
    replay_metric,
)
from gapprune.prune.plan import kept_units

log = logging.getLogger(__name__)


@dataclass
class RefineResult:
    allocation: Allocation
    history: list[dict[str, Any]] = field(default_factory=list)


def _kept_by_component(
    adapter: ModelAdapter, scores: UnitScores, table: LossTable, allocation: Allocation
) -> dict[tuple[int, str], list[int]]:
    return {
        (layer, c): kept_units(scores, adapter, layer, c, table.options[c][allocation.choice[c][layer]])
        for layer in range(table.n_layers)
        for c in COMPONENTS
    }


@torch.inference_mode()
def true_loss(adapter: ModelAdapter, inputs: LayerInputs, scores: UnitScores, table: LossTable, allocation: Allocation) -> float:
    """The metric with every component pruned as `allocation` says (minus the dense replay's)."""
    device = next(adapter.model.parameters()).device
    reference = dense_reference(adapter, inputs, device)
    base = replay_metric(adapter, inputs, 0, table.metric, reference, device)
    with UnitMasks(adapter) as masks:
        for (layer, c), kept in _kept_by_component(adapter, scores, table, allocation).items():
            masks.set_(layer, c, kept)
        return replay_metric(adapter, inputs, 0, table.metric, reference, device) - base


@torch.inference_mode()
def conditional_loss_table(
    adapter: ModelAdapter, inputs: LayerInputs, scores: UnitScores, table: LossTable, allocation: Allocation,
    mlp_stride: int = 1, progress: bool = True,
) -> LossTable:
    """ΔL[l, c, k] = M(plan with (l, c) at option k) − M(plan with (l, c) dense), others as planned."""
    device = next(adapter.model.parameters()).device
    reference = dense_reference(adapter, inputs, device)
    kept_plan = _kept_by_component(adapter, scores, table, allocation)
    loss = {c: np.zeros_like(table.loss[c]) for c in COMPONENTS}
    measured = {c: measured_options(len(table.options[c]), mlp_stride if c == "mlp" else 1) for c in COMPONENTS}
    batch = int(inputs.input_ids[0].shape[0])
    with UnitMasks(adapter) as masks:
        for (layer, c), kept in kept_plan.items():
            masks.set_(layer, c, kept)
        planned = capture_layer_inputs(adapter, torch.cat(inputs.input_ids), batch_size=batch, progress=False)
        bar = tqdm(total=table.n_layers * sum(len(m) for m in measured.values()), desc="refine ΔL", disable=not progress)
        for layer in range(table.n_layers):
            for c in COMPONENTS:
                masks.set_(layer, c, None)
                base = replay_metric(adapter, planned, layer, table.metric, reference, device)
                for k in measured[c]:
                    if k:
                        masks.set_(layer, c, kept_units(scores, adapter, layer, c, table.options[c][k]))
                        loss[c][layer, k] = replay_metric(adapter, planned, layer, table.metric, reference, device) - base
                    bar.update()
                if len(measured[c]) < len(table.options[c]):
                    loss[c][layer] = np.interp(table.removed[c][layer], table.removed[c][layer, measured[c]],
                                               loss[c][layer, measured[c]])
                masks.set_(layer, c, kept_plan[(layer, c)])
        bar.close()
    return LossTable(table.metric, table.criterion, table.options, loss, table.removed, {**table.meta, "conditional": True})


def refine(context: AllocationContext, allocation: Allocation, budget_params: int, rounds: int,
           inputs: LayerInputs, mlp_stride: int = 1) -> RefineResult:
    """Re-profile around the plan and re-solve `rounds` times; return the best plan by true loss."""
    adapter, scores, table = context.adapter, context.scores, context.table
    best, best_loss = allocation, true_loss(adapter, inputs, scores, table, allocation)
    history = [{"round": 0, "true_loss": best_loss, "predicted_loss": allocation.predicted_loss(table)}]
    current = allocation
    for round_ in range(1, rounds + 1):
        conditional = conditional_loss_table(adapter, inputs, scores, table, current, mlp_stride)
        candidate = gap_allocator(AllocationContext(adapter, conditional, scores), budget_params)
        candidate = Allocation("gap", candidate.choice, {**candidate.info, "refine_round": round_})
        loss = true_loss(adapter, inputs, scores, table, candidate)
        history.append({"round": round_, "true_loss": loss, "predicted_loss": candidate.predicted_loss(conditional)})
        log.info("refine round %d: true loss %.5f (best %.5f)", round_, loss, best_loss)
        if loss < best_loss:
            best, best_loss = candidate, loss
        current = candidate
    best.info["refine_history"] = history
    best.info["refine_helped"] = best is not allocation
    return RefineResult(best, history)
