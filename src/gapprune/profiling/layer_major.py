"""The exact ΔL profiler in one traversal of the decoder (`engine.layer_major`): the same table as
`build_loss_table_batched`, for models held a layer at a time (streamed from disk or a device)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from gapprune.components import COMPONENTS
from gapprune.engine.capture import LayerInputs
from gapprune.engine.layer_major import Replay, measure_layer_major
from gapprune.engine.replay import Measured, tokens_per_batch
from gapprune.importance.base import UnitScores
from gapprune.models.adapter import ModelAdapter
from gapprune.options import kept_units
from gapprune.profiling.batched import table_from_rows
from gapprune.profiling.loss_table import LossTable, calibration_tokens, option_grid


@torch.inference_mode()
def build_loss_table_layer_major(
    adapter: ModelAdapter,
    inputs: LayerInputs,
    scores: UnitScores,
    *,
    metric: str = "kl",
    channel_step: int,
    mlp_stride: int = 1,
    max_rows: int = 1024,
    chunk_rows: int = 0,
    layers: list[int] | None = None,
    done: Measured | None = None,
    on_layer: Callable[[int, dict[str, dict[int, float]]], None] | None = None,
    progress: bool = True,
    max_pending_bytes: int = 2**30,
    scratch_dir: str | Path | None = None,
) -> LossTable:
    """ΔL for every option of every component of the start `layers` (default all), one pass over the decoder.

    Same arguments and result as `build_loss_table_batched`; `max_pending_bytes` bounds the host memory
    of the pending hidden states (beyond it they go to a scratch file in `scratch_dir`). `max_rows`
    is smaller by default (1024, not 4096): this profiler serves models held a layer at a time, and a
    pass's MLP activations (about 4 x rows x intermediate floats: 900 MB at 4096 rows for an MLP of
    14336) would otherwise outweigh the layer itself.
    """
    start_time = time.perf_counter()
    grid = option_grid(adapter, channel_step, mlp_stride)
    layers = list(range(adapter.n_layers)) if layers is None else layers
    done = dict(done or {})
    todo = sorted(layer for layer in layers if layer not in done)
    replays: list[Replay] = []
    for start in todo:  # layer by layer: a streamed model loads each layer once here
        replays.append(Replay(start, "base", -1, None))
        for c in COMPONENTS:
            replays += [Replay(start, c, k, kept_units(scores, adapter, start, c, grid.options[c][k]))
                        for k in grid.measured[c] if k]
    measured: Measured = {}
    if replays:
        measured = measure_layer_major(adapter, inputs, replays, metric=metric, max_rows=max_rows,
                                       chunk_rows=chunk_rows, progress=progress,
                                       max_pending_bytes=max_pending_bytes, scratch_dir=scratch_dir)
        for layer in todo:
            measured[layer] = {c: ({0: 0.0} | measured[layer][c]) if 0 in grid.measured[c] else measured[layer][c]
                               for c in COMPONENTS}
            if on_layer is not None:
                on_layer(layer, measured[layer])
    measured.update(done)
    meta = {"profiler": "exact", "traversal": "layer_major", "tokens": calibration_tokens(inputs),
            "channel_step": channel_step, "mlp_stride": mlp_stride, "measured": True, "precision": "float32",
            "options_per_pass": max(1, max_rows // tokens_per_batch(inputs)), "resumed_layers": sorted(done),
            "wall_s": round(time.perf_counter() - start_time, 2)}
    return table_from_rows(adapter, grid, measured, scores.criterion, metric, meta)
