"""The exact ΔL profiler, fast: the same table as the reference `build_loss_table`, in fewer, larger
passes of the replay engine (`engine.replay`).

What changes against the reference (and nothing else, so the table agrees to float tolerance):
* several options of one component run as one stacked batch (`engine.masks.option_masks`: each
  copy's input to the output projection multiplied by its option's unit mask, equal to zeroing
  the weight columns, tested);
* the dense replay (the ΔL zero point) is measured once, from the last layer (`dense_base`);
* the metric needs no vocabulary-sized dense reference and no full logits tensor (`engine.head`);
* optionally the replay runs under bf16 autocast (`precision="bfloat16"`: the auto profiler's screen
  where bf16 is fast, docs/performance.md §15), the head's product then of the difference from the
  dense state (`engine.head.RoughHead`); an estimate, not the exact table.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gapprune.engine.capture import LayerInputs
from gapprune.engine.replay import Compensation, Measured, measure_entries, tokens_per_batch
from gapprune.importance.base import UnitScores
from gapprune.models.adapter import ModelAdapter
from gapprune.profiling.loss_table import LossTable, OptionGrid, calibration_tokens, option_grid, units_of


def build_loss_table_batched(
    adapter: ModelAdapter,
    inputs: LayerInputs,
    scores: UnitScores,
    *,
    metric: str = "kl",
    channel_step: int,
    mlp_stride: int = 1,
    max_rows: int = 4096,
    chunk_rows: int = 0,
    precision: str = "float32",
    layers: list[int] | None = None,
    done: Measured | None = None,
    on_layer: Callable[[int, dict[str, dict[int, float]]], None] | None = None,
    progress: bool = True,
    desc: str | None = None,
    compensation: Compensation | None = None,
    thin: int = 1,
) -> LossTable:
    """ΔL for every option of every component of every layer, `max_rows` stacked tokens per pass.

    `layers` profiles only those layers (the others stay 0): for timing and cost models. `done`
    holds layers measured before (a resumed run): they are not replayed again. `thin` > 1 replays
    only every `thin`-th option of the grid (and the last) and interpolates the rest (a screen).
    """
    grid = option_grid(adapter, channel_step, mlp_stride).thinned(thin)
    start_time = time.perf_counter()
    layers = list(range(adapter.n_layers)) if layers is None else layers
    done = dict(done or {})
    todo = {layer: dict(grid.measured) for layer in layers if layer not in done}
    layer_wall: dict[int, float] = {}
    last = [time.perf_counter()]

    def timed(layer: int, row: dict[str, dict[int, float]]) -> None:
        layer_wall[layer] = round(time.perf_counter() - last[0], 4)
        last[0] = time.perf_counter()
        if on_layer is not None:
            on_layer(layer, row)

    measured = measure_entries(adapter, inputs, todo, units_of(adapter, scores, grid.options), metric=metric, max_rows=max_rows,
                               chunk_rows=chunk_rows, precision=precision, progress=progress,
                               desc=desc or f"profile ΔL ({metric}, batched)", on_layer=timed,
                               compensation=compensation) if todo else {}
    measured.update(done)
    meta = {"profiler": "exact", "tokens": calibration_tokens(inputs), "channel_step": channel_step,
            "mlp_stride": mlp_stride, "thin": thin, "measured": True, "precision": precision, "compensated": compensation is not None,
            "options_per_pass": max(1, max_rows // tokens_per_batch(inputs)), "resumed_layers": sorted(done),
            "layer_wall_s": layer_wall, "wall_s": round(time.perf_counter() - start_time, 2)}
    return table_from_rows(adapter, grid, measured, scores.criterion, metric, meta)


def table_from_rows(adapter: ModelAdapter, grid: OptionGrid, measured: Measured, criterion: str, metric: str,
                    meta: dict[str, Any]) -> LossTable:
    """The loss table of measured rows: unmeasured options interpolated within each measured layer, others 0."""
    loss = grid.empty_loss()
    for layer, row in measured.items():
        for c, values in row.items():
            for k, value in values.items():
                loss[c][layer, int(k)] = value
        grid.interpolate_(loss, layer)
    return LossTable(metric=metric, criterion=criterion, options=grid.options, loss=loss, removed=grid.removed,
                     meta=meta, exact=grid.exact_mask(), param_unit=adapter.hidden)
