"""The per-layer signals that baseline allocators read (block influence, outlier ratios, unit scores).

They are computed here, from the calibration pass, and handed to `allocate/` as numbers.
"""

from __future__ import annotations

import numpy as np
import torch

from gapprune.allocate.signals import LayerSignals
from gapprune.calibrate.stats import CalibrationStats
from gapprune.components import COMPONENTS
from gapprune.engine.capture import LayerInputs
from gapprune.importance.base import UnitScores, row_blocks
from gapprune.models.adapter import ModelAdapter


def block_influence(inputs: LayerInputs) -> np.ndarray:
    """ShortGPT's BI per layer: 1 − mean cosine similarity of the layer's input and output tokens. -> (L,)"""
    bi = np.zeros(inputs.n_layers)
    for layer in range(inputs.n_layers):
        sims = [
            torch.nn.functional.cosine_similarity(inputs.hidden[layer][b].float(), inputs.layer_output(layer, b).float(), dim=-1)
            for b in range(inputs.n_batches)
        ]
        bi[layer] = 1 - float(torch.cat([s.flatten() for s in sims]).mean())
    return bi


@torch.inference_mode()
def outlier_ratio(adapter: ModelAdapter, stats: CalibrationStats, multiple: float = 5.0) -> np.ndarray:
    """OWL's layer-wise outlier ratio: share of Wanda scores |W_ij|·||X_j|| above `multiple` × their mean. -> (L,)"""
    ratios = np.zeros(adapter.n_layers)
    for layer in range(adapter.n_layers):
        outliers, total = 0, 0
        for c in COMPONENTS:
            out = adapter.out_proj(layer, c)
            for linear in adapter.component_weights(layer, c):
                role = f"{c}_out" if linear is out else f"{c}_in"
                norm = stats.get(layer, role).mean_sq.sqrt().float()  # (in,) ~ ||X_j|| / sqrt(tokens)
                norm = norm.to(linear.weight.device)
                blocks = row_blocks(linear.weight.detach())  # scores |W_ij|·norm_j, a block of rows at a time
                mean = sum(float((b.abs().float() * norm).double().sum()) for b in blocks) / linear.weight.numel()
                outliers += sum(int((b.abs().float() * norm > multiple * mean).sum()) for b in blocks)
                total += linear.weight.numel()
        ratios[layer] = outliers / total
    return ratios


def layer_signals(adapter: ModelAdapter, inputs: LayerInputs, stats: CalibrationStats, scores: UnitScores) -> LayerSignals:
    """Every signal the baseline allocators read, from one calibration pass."""
    return LayerSignals(
        block_influence=block_influence(inputs),
        outlier_ratio=outlier_ratio(adapter, stats),
        unit_scores={c: [scores.get(l, c).numpy().astype(np.float64) for l in range(adapter.n_layers)] for c in COMPONENTS},
    )
