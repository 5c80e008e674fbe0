"""Small builders shared by tests: a profile of a tiny model without any data files."""

from __future__ import annotations

import torch

from gapprune.calibrate import CalibrationStats, capture_layer_inputs, stats_hooks
from gapprune.importance import ScoringContext, accumulate_gradients, score_units
from gapprune.models import get_adapter
from gapprune.pipeline import Profile
from gapprune.profiling import build_loss_table


def tiny_profile(model: torch.nn.Module, ids: torch.Tensor, criterion: str = "activation", metric: str = "kl",
                 channel_step: int = 32) -> Profile:
    adapter = get_adapter(model)
    stats = CalibrationStats()
    inputs = capture_layer_inputs(adapter, ids, batch_size=2, extra_hooks=stats_hooks(adapter, stats), progress=False)
    grads = accumulate_gradients(adapter, ids, batch_size=2, progress=False) if criterion == "taylor" else {}
    scores = score_units(ScoringContext(adapter, stats, grads), criterion)
    table = build_loss_table(adapter, inputs, scores, metric=metric, channel_step=channel_step, progress=False)
    total = sum(p.numel() for p in model.parameters())
    return Profile(adapter, inputs, stats, scores, table, total, inputs)
