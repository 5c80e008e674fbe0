"""The `exact` profiler's measurement from a live `Calibration`: every option replayed, rows checkpointed per
layer and resumed, start layers split over torchrun ranks, a streamed model traversed once layer-major; and
what every profiler shares (the channel step, the compensation-aware refit, the costs-only table)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from gapprune.allocate import LossTable
from gapprune.budget import reads_loss
from gapprune.config import TABLE_SETTINGS, PruneConfig
from gapprune.distributed import gather_table, shard_layers
from gapprune.engine.masks import Compensated
from gapprune.engine.replay import (
    Compensation,
)
from gapprune.models import ModelAdapter
from gapprune.models.loading import default_cache_dir
from gapprune.models.streaming import is_streamed
from gapprune.options import default_channel_step
from gapprune.profiling.auto import Solve
from gapprune.profiling.batched import build_loss_table_batched
from gapprune.profiling.checkpoint import LayerCheckpoint, run_key
from gapprune.profiling.layer_major import build_loss_table_layer_major
from gapprune.profiling.loss_table import build_loss_table, calibration_tokens
from gapprune.refit import compensated_projection

if TYPE_CHECKING:
    from gapprune.profiling.calibration import Calibration

log = logging.getLogger(__name__)


def step_of(adapter: ModelAdapter, config: PruneConfig) -> int:
    """MLP channels per option: the configured step, else the default for this width."""
    return config.channel_step or default_channel_step(adapter.layer_shape(0).intermediate)


def needs_loss_table(config: PruneConfig) -> bool:
    """Only GAP reads ΔL; the baselines need the options' parameter costs alone."""
    return reads_loss(config.allocator)


def costs_only(calibration: Calibration, config: PruneConfig) -> LossTable:
    """The options' parameter costs with ΔL left at 0: all a baseline allocator reads."""
    return build_loss_table(calibration.adapter, calibration.profile_inputs, calibration.unit_scores,
                            channel_step=step_of(calibration.adapter, config), measure=False)


def measure_exact(calibration: Calibration, config: PruneConfig, checkpoint_dir: Path | None = None,
                  solve: Solve | None = None) -> LossTable:
    """`exact`: every option replayed; rows checkpointed per layer and resumed, start layers split
    over torchrun ranks, a streamed model traversed once layer-major."""
    adapter, scores = calibration.adapter, calibration.unit_scores
    step = step_of(adapter, config)
    key = run_key({"fingerprint": calibration.fingerprint(config, TABLE_SETTINGS),
                   "profile_tokens": calibration_tokens(calibration.profile_inputs)})
    layer_checkpoint = LayerCheckpoint(checkpoint_dir or default_cache_dir() / "tables", key)
    done = layer_checkpoint.load()
    if done:
        log.info("resuming the loss table: %d of %d layers already measured", len(done), adapter.n_layers)
    layers = shard_layers(adapter.n_layers)  # this rank's start layers: all of them outside torchrun
    if is_streamed(adapter.model):  # reads each layer once: traverse the decoder once, not once per start layer
        table = build_loss_table_layer_major(
            adapter, calibration.profile_inputs, scores, metric=config.metric, channel_step=step,
            mlp_stride=config.mlp_stride, layers=layers, done=done, on_layer=layer_checkpoint.save)
    else:  # compensation-aware tables are refused for streamed models (check_supported)
        table = build_loss_table_batched(
            adapter, calibration.profile_inputs, scores, metric=config.metric, channel_step=step,
            mlp_stride=config.mlp_stride, layers=layers, done=done, on_layer=layer_checkpoint.save,
            compensation=table_compensation(calibration, config))
    table = gather_table(table, layers)
    layer_checkpoint.clear()
    return table


def table_compensation(calibration: Calibration, config: PruneConfig) -> Compensation | None:
    """With `compensation_aware`, each option's output projection as `compensate` will leave it,
    refitted out of sample.

    The table's ΔL is measured on the first calibration windows, which lie in the first batch and
    so in the half the saved model's refit is fitted on; measured there, a refit looks better than
    it generalises (measured: the allocation then over-trusts compensation, 102.8 vs 96.1 WikiText-2
    and 222.7 vs 167.1 PTB at 25%, docs/results.md). The table's refits are therefore fitted on the
    other half, so each ΔL says what compensation does on tokens it was not fitted to.
    """
    if not config.compensation_aware:
        return None
    if calibration.gram is None:
        raise ValueError("the compensation-aware table needs the Gram statistics of the calibration pass")
    if config.profile_samples > config.batch_size:
        log.warning("the profiling windows span %d calibration batches: the compensation-aware table is "
                    "partly measured on its own fit", -(-config.profile_samples // config.batch_size))
    adapter, gram = calibration.adapter, calibration.gram.swapped()

    def compensated(layer: int, component: str, kept: list[int]) -> Compensated | None:
        return compensated_projection(adapter, layer, component, kept, gram, config.compensate, config.ridge)

    return compensated
