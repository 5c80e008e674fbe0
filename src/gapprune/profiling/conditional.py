"""ΔL around a plan: every component measured *given all the others pruned as planned*.

The additive model behind the knapsack ignores interactions between components. Refinement (DESIGN
§4, `refine`) corrects for them: re-capture the layer inputs with the plan's masks in place,
then, one component at a time, lift that component's mask and measure each option of it with the
batched exact profiler against the plan-with-that-component-dense. `true_loss` measures a whole
plan at once (every component pruned), which is how refinement decides which plan to keep.
"""

from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm

from gapprune.allocate.table import LossTable
from gapprune.components import COMPONENTS
from gapprune.engine.capture import LayerInputs, capture_layer_inputs
from gapprune.engine.head import dense_reference
from gapprune.engine.masks import UnitMasks
from gapprune.engine.replay import Entries, Measured, measure_entries, positions, replay_stacked
from gapprune.importance.base import UnitScores
from gapprune.models.adapter import ModelAdapter
from gapprune.options import kept_units
from gapprune.profiling.auto import Solve, auto_table
from gapprune.profiling.loss_table import measured_options, units_of

Choice = dict[str, list[int]]  # component -> option index per layer


def kept_by_component(adapter: ModelAdapter, scores: UnitScores, table: LossTable, choice: Choice) -> dict[tuple[int, str], list[int]]:
    return {
        (layer, c): kept_units(scores, adapter, layer, c, table.options[c][choice[c][layer]])
        for layer in range(table.n_layers)
        for c in COMPONENTS
    }


@torch.inference_mode()
def true_loss(adapter: ModelAdapter, inputs: LayerInputs, scores: UnitScores, table: LossTable, choice: Choice,
              chunk_rows: int = 0) -> float:
    """The metric with every component pruned as `choice` says, minus the dense model's (per position)."""
    device = next(adapter.model.parameters()).device
    reference = dense_reference(adapter, inputs, table.metric, device, chunk_rows)
    n_positions = positions(inputs, table.metric)

    def replay() -> float:
        return float(replay_stacked(adapter, inputs, 0, None, [None], reference, device, chunk_rows)[0])

    dense = replay()
    with UnitMasks(adapter) as masks:
        for (layer, c), kept in kept_by_component(adapter, scores, table, choice).items():
            masks.set_(layer, c, kept)
        return (replay() - dense) / n_positions


@torch.inference_mode()
def conditional_loss_table(
    adapter: ModelAdapter, inputs: LayerInputs, scores: UnitScores, table: LossTable, choice: Choice,
    mlp_stride: int = 1, progress: bool = True, solve: Solve | None = None, margin: float = 0.25,
) -> LossTable:
    """ΔL[l, c, k] = M(plan with (l, c) at option k) − M(plan with (l, c) dense), the others as planned.

    Without `solve` every option of every component is measured: as costly as the exact profiler
    (on the 1.5B model, two cores: 4 of 56 components in 15 minutes, about 3.5 hours in all). With
    `solve` (the allocation the refined table is for) the auto profiler's rule picks what to measure:
    `table`'s own values are the estimate, and only entries that could change `solve`'s plan, within
    `margin`, are measured around the plan (32 minutes on the same model and machine).
    """
    device = next(adapter.model.parameters()).device
    reference = dense_reference(adapter, inputs, table.metric, device)  # always against the dense model
    planned_kept = kept_by_component(adapter, scores, table, choice)
    measured = {c: measured_options(len(table.options[c]), mlp_stride if c == "mlp" else 1) for c in COMPONENTS}
    batch = int(inputs.input_ids[0].shape[0])
    with UnitMasks(adapter) as masks:
        for (layer, c), kept in planned_kept.items():
            masks.set_(layer, c, kept)
        planned = capture_layer_inputs(adapter, torch.cat(inputs.input_ids), batch_size=batch, progress=False)

        def measure(entries: Entries) -> Measured:
            """Each listed component measured with its own mask lifted, the others as planned."""
            out: Measured = {}
            for layer, per in entries.items():
                for c, options in per.items():
                    masks.set_(layer, c, None)
                    row = measure_entries(adapter, planned, {layer: {c: options}}, units_of(adapter, scores, table.options),
                                          metric=table.metric, reference=reference, progress=False)[layer][c]
                    masks.set_(layer, c, planned_kept[(layer, c)])
                    out.setdefault(layer, {})[c] = row
            return out

        meta = {**table.meta, "conditional": True}
        if solve is not None:
            estimate = LossTable(table.metric, table.criterion, table.options, {c: table.loss[c].copy() for c in COMPONENTS},
                                 table.removed, {k: v for k, v in meta.items() if k != "auto"},
                                 {c: np.zeros(table.loss[c].shape, dtype=bool) for c in COMPONENTS}, table.param_unit)
            return auto_table(estimate, measure, solve, columns=measured, margin=margin, progress=progress)
        loss = {c: np.zeros_like(table.loss[c]) for c in COMPONENTS}
        exact = {c: np.zeros(table.loss[c].shape, dtype=bool) for c in COMPONENTS}
        bar = tqdm(total=table.n_layers * len(COMPONENTS), desc="refine ΔL around the plan", disable=not progress)
        for layer in range(table.n_layers):
            for c in COMPONENTS:
                for k, value in measure({layer: {c: measured[c]}})[layer][c].items():
                    loss[c][layer, k] = value
                    exact[c][layer, k] = True
                if len(measured[c]) < len(table.options[c]):
                    loss[c][layer] = np.interp(table.removed[c][layer], table.removed[c][layer, measured[c]],
                                               loss[c][layer, measured[c]])
                bar.update()
        bar.close()
    return LossTable(table.metric, table.criterion, table.options, loss, table.removed, meta, exact, table.param_unit)
