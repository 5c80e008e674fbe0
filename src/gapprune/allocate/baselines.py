"""Baseline allocators (DESIGN §5): uniform, global (FLAP), depth (ShortGPT), owl (OWL)."""

from __future__ import annotations

import numpy as np
import torch

from gapprune.allocate.base import (
    ALLOCATORS,
    Allocation,
    AllocationContext,
    check_budget,
    fit_fractions_to_budget,
)
from gapprune.allocate.knapsack import InfeasibleBudget
from gapprune.models.adapter import COMPONENTS


@ALLOCATORS.register("uniform")
def uniform_allocator(context: AllocationContext, budget_params: int) -> Allocation:
    """The same removal fraction in every component of every layer (LLM-Pruner, Wanda-sp)."""
    n = context.table.n_layers
    choice, rate = fit_fractions_to_budget(
        context.table, budget_params, lambda t: {c: np.full(n, t) for c in COMPONENTS}, 0.0, 1.0
    )
    return Allocation("uniform", choice, {"rate": rate})


def _standardised(values: torch.Tensor) -> np.ndarray:
    v = values.double()
    return ((v - v.mean()) / (v.std() + 1e-12)).numpy()


@ALLOCATORS.register("global")
def global_allocator(context: AllocationContext, budget_params: int) -> Allocation:
    """FLAP: scores standardised within each component, one global threshold for all units."""
    z = {c: [_standardised(context.scores.get(l, c)) for l in range(context.table.n_layers)] for c in COMPONENTS}

    def fractions(t: float) -> dict[str, np.ndarray]:
        return {c: np.array([(zl < t).mean() for zl in z[c]]) for c in COMPONENTS}

    lo = min(float(zl.min()) for per in z.values() for zl in per) - 1
    hi = max(float(zl.max()) for per in z.values() for zl in per) + 1
    choice, threshold = fit_fractions_to_budget(context.table, budget_params, fractions, lo, hi)
    return Allocation("global", choice, {"threshold": threshold})


def block_influence(context: AllocationContext) -> np.ndarray:
    """ShortGPT's BI per layer: 1 − mean cosine similarity of the layer's input and output tokens."""
    inputs = context.inputs
    if inputs is None:
        raise ValueError("the depth allocator needs cached layer inputs")
    bi = np.zeros(inputs.n_layers)
    for layer in range(inputs.n_layers):
        sims = [
            torch.nn.functional.cosine_similarity(inputs.hidden[layer][b], inputs.layer_output(layer, b), dim=-1)
            for b in range(inputs.n_batches)
        ]
        bi[layer] = 1 - float(torch.cat([s.flatten() for s in sims]).mean())
    return bi


@ALLOCATORS.register("depth")
def depth_allocator(context: AllocationContext, budget_params: int) -> Allocation:
    """Remove whole layers, least block influence first, until the budget is met."""
    table = context.table
    check_budget(table, budget_params)
    bi = block_influence(context)
    choice = {c: [0] * table.n_layers for c in COMPONENTS}
    removed = 0
    dropped = []
    for layer in np.argsort(bi, kind="stable"):
        if removed >= budget_params:
            break
        for c in COMPONENTS:
            choice[c][int(layer)] = len(table.options[c]) - 1  # last option removes the sub-block
            removed += int(table.removed[c][int(layer), -1])
        dropped.append(int(layer))
    if removed < budget_params:
        raise InfeasibleBudget("removing every layer does not reach the budget")
    return Allocation("depth", choice, {"block_influence": bi.round(5).tolist(), "removed_layers": sorted(dropped)})


def outlier_ratio(context: AllocationContext, multiple: float = 5.0) -> np.ndarray:
    """OWL's layer-wise outlier ratio: share of Wanda scores |W_ij|·||X_j|| above `multiple` × their mean."""
    stats = context.stats
    if stats is None:
        raise ValueError("the owl allocator needs calibration statistics")
    adapter = context.adapter
    ratios = np.zeros(adapter.n_layers)
    roles = {"attn": ("attn_in", "attn_out"), "mlp": ("mlp_in", "mlp_out")}
    for layer in range(adapter.n_layers):
        outliers, total = 0, 0
        for c in COMPONENTS:
            linears = adapter.component_weights(layer, c)
            for linear in linears:
                is_out = linear is adapter.out_proj(layer, c)
                role = roles[c][1] if is_out else roles[c][0]
                norm = stats.get(layer, role).mean_sq.sqrt().float()  # (in,) ~ ||X_j|| / sqrt(tokens)
                score = linear.weight.detach().abs().float() * norm  # (out, in)
                outliers += int((score > multiple * score.mean()).sum())
                total += score.numel()
        ratios[layer] = outliers / total
    return ratios


@ALLOCATORS.register("owl")
def owl_allocator(context: AllocationContext, budget_params: int, lam: float = 0.08) -> Allocation:
    """OWL: layers with more outliers are pruned less; rates spread over ±lam around the mean rate."""
    ratio = outlier_ratio(context)
    spread = ratio.max() - ratio.min()
    normalised = (ratio - ratio.min()) / spread if spread > 0 else np.zeros_like(ratio)
    offset = lam - 2 * lam * normalised  # most outliers -> -lam, fewest -> +lam
    offset -= offset.mean()

    def fractions(t: float) -> dict[str, np.ndarray]:
        return {c: np.clip(t + offset, 0, 1) for c in COMPONENTS}

    choice, rate = fit_fractions_to_budget(context.table, budget_params, fractions, 0.0, 1.0 + lam)
    return Allocation("owl", choice, {"rate": rate, "outlier_ratio": ratio.round(6).tolist()})
