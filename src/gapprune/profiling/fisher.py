"""Second-order ΔL estimate from the Fisher information of unit masks: one forward + backward per batch.

Every unit (query head, MLP channel) gets a multiplicative mask m = 1 on its input to the output
projection, one mask row per sample, so one backward pass yields every sample's gradient g_n with
respect to its own masks. Removing a set S of units moves m by −1_S, and to second order

    ΔL(S) ≈ ½ · 1_Sᵀ F 1_S = ½ · mean_n (g_n · 1_S)²,   F = mean_n g_n g_nᵀ,

with F kept as the full within-component block (never materialised: the per-sample gradients are),
g_n the gradient of sample n's summed token losses, divided by its positions (see `fisher_delta`).
Labels: `model` samples each next token from the dense model's own distribution, which makes F the
true Fisher = the Hessian of KL(dense ‖ pruned) at the dense model (the `kl` metric); `data` uses the
text's next tokens (the empirical Fisher of the NLL). Components of different layers are assumed
independent, as the knapsack assumes anyway.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from gapprune.components import COMPONENTS
from gapprune.engine.capture import batches
from gapprune.engine.masks import scaled_inputs
from gapprune.engine.metrics import METRICS
from gapprune.importance.base import UnitScores
from gapprune.models.adapter import ModelAdapter
from gapprune.options import kept_units
from gapprune.profiling.auto import Solve
from gapprune.profiling.exact import step_of
from gapprune.profiling.loss_table import LossTable, option_grid

if TYPE_CHECKING:
    from gapprune.config import PruneConfig
    from gapprune.profiling.calibration import Calibration

LABELS = ("model", "data")


def per_sample_loss(logits: torch.Tensor, input_ids: torch.Tensor, labels: str, generator: torch.Generator) -> torch.Tensor:
    """(B,) summed next-token cross-entropy per sample, against sampled (`model`) or text (`data`) labels."""
    logits = logits.float()
    if labels == "model":
        probs = torch.softmax(logits.detach(), dim=-1).flatten(0, 1)  # sampled where it lies: no (B·T, V) copy to the host
        targets = torch.multinomial(probs, 1, generator=generator).view(logits.shape[:2])
    elif labels == "data":
        logits, targets = logits[:, :-1], input_ids[:, 1:]
    else:
        raise ValueError(f"fisher labels must be one of {LABELS}, got {labels!r}")
    loss = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # (B, T)
    return loss.sum(dim=1)


def mask_gradients(adapter: ModelAdapter, input_ids: torch.Tensor, *, batch_size: int, labels: str = "model",
                   seed: int = 0, progress: bool = True) -> dict[tuple[int, str], torch.Tensor]:
    """Per-sample gradients of the loss w.r.t. every component's unit masks: {(layer, c): (N, units)}."""
    model = adapter.model
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)  # on a CPU the same stream as before
    grads: dict[tuple[int, str], list[torch.Tensor]] = {}
    frozen = [p for p in model.parameters() if p.requires_grad]
    for p in frozen:
        p.requires_grad_(False)
    try:
        for batch in tqdm(list(batches(input_ids, batch_size)), desc=f"fisher ({labels} labels)", disable=not progress):
            batch = batch.to(device)
            masks: dict[tuple[int, str], torch.Tensor] = {}
            with contextlib.ExitStack() as scaled:
                for layer in range(adapter.n_layers):
                    for c in COMPONENTS:
                        out = adapter.out_proj(layer, c)
                        if out is None:
                            continue
                        unit = adapter.unit_width(c)
                        mask = torch.ones(batch.shape[0], out.in_features // unit, device=device, requires_grad=True)
                        masks[(layer, c)] = mask
                        scaled.enter_context(scaled_inputs(out, mask.repeat_interleave(unit, dim=1)))
                with torch.enable_grad():
                    logits = model(input_ids=batch, use_cache=False).logits
                    per_sample_loss(logits, batch, labels, generator).sum().backward()
            for key, mask in masks.items():
                assert mask.grad is not None
                grads.setdefault(key, []).append(mask.grad.detach().double().cpu())
    finally:
        for p in frozen:
            p.requires_grad_(True)
    return {key: torch.cat(parts) for key, parts in grads.items()}


def fisher_delta(grads: torch.Tensor, removed: torch.Tensor, positions: int) -> float:
    """½ · mean_n (g_n · 1_S)² / positions: per-sample gradients (N, units) of summed token losses,
    removed-unit indicator (units,). With model-sampled labels the cross-position terms of g_n g_nᵀ
    vanish in expectation, so dividing by the positions per sample gives the per-token KL Hessian."""
    return float(0.5 * ((grads @ removed.double()) ** 2).mean() / positions)


def build_loss_table_fisher(
    adapter: ModelAdapter,
    input_ids: torch.Tensor,
    scores: UnitScores,
    *,
    metric: str = "kl",
    channel_step: int,
    batch_size: int = 8,
    labels: str | None = None,
    seed: int = 0,
    progress: bool = True,
) -> LossTable:
    """A loss table from the Fisher estimate: every option of every component, no replay.

    `labels` defaults to `model` for the kl metric and `data` for nll.
    """
    labels = labels or METRICS.get(metric).fisher_labels
    start = time.perf_counter()
    grid = option_grid(adapter, channel_step)
    grads = mask_gradients(adapter, input_ids, batch_size=batch_size, labels=labels, seed=seed, progress=progress)
    loss = grid.empty_loss()
    positions = input_ids.shape[1] - (labels == "data")
    for layer in range(adapter.n_layers):
        for c in COMPONENTS:
            g = grads[(layer, c)]
            for k, option in enumerate(grid.options[c]):
                removed = torch.ones(g.shape[1])
                removed[kept_units(scores, adapter, layer, c, option)] = 0
                loss[c][layer, k] = fisher_delta(g, removed, positions)
    meta = {"profiler": "fisher", "labels": labels, "tokens": int(input_ids.numel()), "samples": int(input_ids.shape[0]),
            "channel_step": channel_step, "measured": True, "wall_s": round(time.perf_counter() - start, 2)}
    estimated = {c: np.zeros(v.shape, dtype=bool) for c, v in loss.items()}
    return LossTable(metric=metric, criterion=scores.criterion, options=grid.options, loss=loss, removed=grid.removed,
                     meta=meta, exact=estimated, param_unit=adapter.hidden)


def ranks(x: np.ndarray) -> np.ndarray:
    """Ranks from 0, ties sharing their average rank."""
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    first = np.cumsum(counts) - counts
    return (first + (counts - 1) / 2)[inverse]


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.corrcoef(ranks(np.asarray(x)), ranks(np.asarray(y)))[0, 1])


def rank_correlation(a: LossTable, b: LossTable) -> float:
    """Spearman correlation of two tables' ΔL over every non-trivial option (option 0 is 0 in both)."""
    x = np.concatenate([a.loss[c][:, 1:].ravel() for c in COMPONENTS])
    y = np.concatenate([b.loss[c][:, 1:].ravel() for c in COMPONENTS])
    return spearman(x, y)


def measure_fisher(calibration: Calibration, config: PruneConfig, checkpoint_dir: Path | None = None,
                   solve: Solve | None = None) -> LossTable:
    """`fisher` (the registry's entry): the estimate on the calibration windows; no replay, nothing to resume."""
    adapter = calibration.adapter
    return build_loss_table_fisher(adapter, calibration.ids, calibration.unit_scores, metric=config.metric,
                                   channel_step=step_of(adapter, config), batch_size=config.batch_size, seed=config.seed)
