"""The pruning pipeline: calibrate -> score -> profile ΔL -> allocate -> plan -> surgery.

Every stage hands a plain value to the next (token ids, LayerInputs, UnitScores, LossTable,
Allocation, Plan), so each can be cached, resumed or tested alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from gapprune.allocate import ALLOCATORS, Allocation, AllocationContext
from gapprune.allocate.refine import refine
from gapprune.calibrate import CalibrationStats, LayerInputs, capture_layer_inputs, stats_hooks
from gapprune.config import PruneConfig
from gapprune.data import load_text, sample_windows, self_generated_windows, tokenize_text
from gapprune.importance import ScoringContext, UnitScores, accumulate_gradients, score_units
from gapprune.models import COMPONENTS, ModelAdapter, get_adapter
from gapprune.profiling import LossTable, build_loss_table
from gapprune.profiling.batched import build_loss_table_batched
from gapprune.profiling.fisher import build_loss_table_fisher
from gapprune.prune import Plan, apply_plan_, default_channel_step, make_plan
from gapprune.prune.compensate import GramStats, compensate_, gram_hooks

log = logging.getLogger(__name__)


@dataclass
class Profile:
    """Everything measured on the dense model; reusable for several ratios and allocators."""

    adapter: ModelAdapter
    inputs: LayerInputs
    stats: CalibrationStats
    scores: UnitScores
    table: LossTable
    total_params: int
    profile_inputs: LayerInputs | None = None  # the calibration prefix the table was measured on
    gram: GramStats | None = None  # output-projection input Gram matrices, for compensation
    timings: dict[str, float] = field(default_factory=dict)


@contextmanager
def _timed(timings: dict[str, float], phase: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    timings[phase] = round(timings.get(phase, 0.0) + time.perf_counter() - start, 3)
    log.info("%s took %.1f s", phase, timings[phase])


def calibration_ids(model: nn.Module, tokenizer: PreTrainedTokenizerBase, config: PruneConfig) -> torch.Tensor:
    """Calibration windows (n, T): seeded samples of a data set or file, or text the model writes."""
    if config.calib == "self":
        return self_generated_windows(model, tokenizer, config.calib_samples, config.seq_len, config.seed)
    text = load_text(config.calib, config.calib_split, config.data_dir)
    return sample_windows(tokenize_text(text, tokenizer), config.calib_samples, config.seq_len, config.seed)


def _prefix(inputs: LayerInputs, n_batches: int) -> LayerInputs:
    return LayerInputs(
        hidden=[h[:n_batches] for h in inputs.hidden],
        kwargs=[k[:n_batches] for k in inputs.kwargs],
        final_hidden=inputs.final_hidden[:n_batches],
        input_ids=inputs.input_ids[:n_batches],
    )


def needs_loss_table(config: PruneConfig) -> bool:
    """Only GAP reads ΔL; the baselines need the options' parameter costs alone."""
    return config.allocator == "gap"


def profile_model(model: nn.Module, tokenizer: PreTrainedTokenizerBase, config: PruneConfig) -> Profile:
    """Calibrate, score units and build (or load) the loss table on the dense `model`."""
    adapter = get_adapter(model)
    timings: dict[str, float] = {}
    total = sum(p.numel() for p in model.parameters())
    with _timed(timings, "calibration_data"):
        ids = calibration_ids(model, tokenizer, config)
    stats = CalibrationStats()
    gram = GramStats() if config.compensate != "none" else None
    stat_hooks, gram_hook = stats_hooks(adapter, stats), gram_hooks(adapter, gram) if gram is not None else None

    def hooks() -> list[torch.utils.hooks.RemovableHandle]:
        return stat_hooks() + (gram_hook() if gram_hook is not None else [])

    with _timed(timings, "capture"):
        inputs = capture_layer_inputs(adapter, ids, batch_size=config.batch_size, extra_hooks=hooks)
    with _timed(timings, "importance"):
        grads = accumulate_gradients(adapter, ids, batch_size=config.batch_size) if config.criterion == "taylor" else {}
        scores = score_units(ScoringContext(adapter, stats, grads), config.criterion)
    profile_inputs = _prefix(inputs, -(-config.profile_samples // config.batch_size))
    if config.loss_table:
        table = LossTable.load(config.loss_table)
        if table.n_layers != adapter.n_layers or table.criterion != config.criterion:
            raise ValueError(f"{config.loss_table} was profiled for another model or criterion ({table.criterion})")
    else:
        step = config.channel_step or default_channel_step(adapter.layer_shape(0).intermediate)
        with _timed(timings, "profiling"):
            if not needs_loss_table(config):
                table = build_loss_table(adapter, profile_inputs, scores, channel_step=step, measure=False)
            elif config.profiler == "fisher":
                table = build_loss_table_fisher(adapter, ids, scores, metric=config.metric, channel_step=step,
                                                batch_size=config.batch_size, seed=config.seed)
            else:
                table = build_loss_table_batched(adapter, profile_inputs, scores, metric=config.metric,
                                                 channel_step=step, mlp_stride=config.mlp_stride)
    return Profile(adapter, inputs, stats, scores, table, total, profile_inputs, gram, timings)


def allocate(profile: Profile, ratio: float, allocator: str, refine_rounds: int = 0, mlp_stride: int = 1) -> Allocation:
    """Choose one option per component so that `ratio` of all parameters go (GAP: optionally refined)."""
    if not 0 < ratio < 1:
        raise ValueError(f"ratio must lie strictly between 0 and 1, got {ratio}")
    budget = int(round(ratio * profile.total_params))
    context = AllocationContext(profile.adapter, profile.table, profile.scores, profile.inputs, profile.stats)
    allocation = ALLOCATORS.get(allocator)(context, budget)
    if refine_rounds:
        if allocator != "gap":
            raise ValueError("--refine applies to the gap allocator only")
        assert profile.profile_inputs is not None
        allocation = refine(context, allocation, budget, refine_rounds, profile.profile_inputs, mlp_stride).allocation
    return allocation


def plan_from_allocation(profile: Profile, allocation: Allocation, config: dict[str, Any]) -> Plan:
    table = profile.table
    plan = make_plan(profile.adapter, profile.scores, allocation.options(table), allocation.losses(table), config)
    decoder = sum(p.numel() for p in profile.adapter.layers.parameters())
    removed = plan.params_removed
    plan.summary = {
        "allocator": allocation.allocator,
        "params_before": profile.total_params,
        "params_after": profile.total_params - removed,
        "params_removed": removed,
        "achieved_ratio": round(removed / profile.total_params, 6),
        "decoder_params_before": decoder,
        "decoder_ratio": round(removed / decoder, 6),
        "predicted_loss": allocation.predicted_loss(table),
        "allocation_info": allocation.info,
    }
    return plan


def prune_model_(model: nn.Module, plan: Plan, compensate: str = "none", gram: GramStats | None = None,
                 ridge: float = 1.0) -> dict[str, Any]:
    """Apply a plan to a dense model in place (physical removal), then optionally compensate."""
    adapter = get_adapter(model)
    if compensate == "none":
        apply_plan_(adapter, plan)
        return {"method": "none"}
    if gram is None:
        raise ValueError("compensation needs the Gram statistics of the calibration pass")
    dense_out = {}
    for lp in plan.layers:
        for c in COMPONENTS:
            out = adapter.out_proj(lp.layer, c)
            if out is not None:
                dense_out[(lp.layer, c)] = out.weight.data.clone()
    kept = {}
    for lp in plan.layers:
        kept[(lp.layer, "attn")] = [h * adapter.head_dim + d for h in lp.attn.kept for d in range(adapter.head_dim)]
        kept[(lp.layer, "mlp")] = list(lp.mlp.kept)
    apply_plan_(adapter, plan)
    summary = compensate_(adapter, dense_out, kept, gram, compensate, ridge)
    adapter.record_shapes_()  # bias compensation may have added biases
    return summary


def component_counts(plan: Plan) -> dict[str, list[int]]:
    return {c: [len(lp.component(c).kept) for lp in plan.layers] for c in COMPONENTS}
