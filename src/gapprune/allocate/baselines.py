"""Baseline allocators (DESIGN §5): uniform, global (FLAP), depth (ShortGPT), owl (OWL).

Each reads the table's option costs and, where its paper needs more, a numeric signal from
`LayerSignals` (unit scores, block influence, outlier ratios) that calibration computed.
"""

from __future__ import annotations

import numpy as np

from gapprune.allocate.base import ALLOCATORS, Allocation, check_budget, fit_fractions_to_budget
from gapprune.allocate.knapsack import InfeasibleBudget
from gapprune.allocate.signals import LayerSignals
from gapprune.allocate.table import LossTable
from gapprune.components import COMPONENTS


@ALLOCATORS.register("uniform")
def uniform_allocator(table: LossTable, signals: LayerSignals | None, budget_params: int) -> Allocation:
    """The same removal fraction in every component of every layer (LLM-Pruner, Wanda-sp)."""
    n = table.n_layers
    choice, rate = fit_fractions_to_budget(table, budget_params, lambda t: {c: np.full(n, t) for c in COMPONENTS}, 0.0, 1.0)
    return Allocation("uniform", choice, {"rate": rate})


def _standardised(values: np.ndarray) -> np.ndarray:
    v = np.asarray(values, dtype=np.float64)
    return (v - v.mean()) / (v.std(ddof=1) + 1e-12)


@ALLOCATORS.register("global")
def global_allocator(table: LossTable, signals: LayerSignals | None, budget_params: int) -> Allocation:
    """FLAP: scores standardised within each component, one global threshold for all units.

    Needs scores comparable across layers (activation, fluctuation, magnitude). The `obs` criterion's
    scores are each layer's removal order, the same ranks 0..n−1 in every layer, so the threshold
    takes the same fraction everywhere: with obs, `global` is `uniform` by construction."""
    scores = (signals or LayerSignals()).require("unit_scores", "global")
    z = {c: [_standardised(scores[c][l]) for l in range(table.n_layers)] for c in COMPONENTS}

    def fractions(t: float) -> dict[str, np.ndarray]:
        return {c: np.array([(zl < t).mean() for zl in z[c]]) for c in COMPONENTS}

    lo = min(float(zl.min()) for per in z.values() for zl in per) - 1
    hi = max(float(zl.max()) for per in z.values() for zl in per) + 1
    choice, threshold = fit_fractions_to_budget(table, budget_params, fractions, lo, hi)
    return Allocation("global", choice, {"threshold": threshold})


@ALLOCATORS.register("depth")
def depth_allocator(table: LossTable, signals: LayerSignals | None, budget_params: int) -> Allocation:
    """Remove whole layers, least block influence first, until the budget is met."""
    check_budget(table, budget_params)
    bi = np.asarray((signals or LayerSignals()).require("block_influence", "depth"))
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


@ALLOCATORS.register("owl")
def owl_allocator(table: LossTable, signals: LayerSignals | None, budget_params: int, lam: float = 0.08) -> Allocation:
    """OWL: layers with more outliers are pruned less; rates spread over ±lam around the mean rate."""
    ratio = np.asarray((signals or LayerSignals()).require("outlier_ratio", "owl"))
    spread = ratio.max() - ratio.min()
    normalised = (ratio - ratio.min()) / spread if spread > 0 else np.zeros_like(ratio)
    offset = lam - 2 * lam * normalised  # most outliers -> -lam, fewest -> +lam
    offset -= offset.mean()

    def fractions(t: float) -> dict[str, np.ndarray]:
        return {c: np.clip(t + offset, 0, 1) for c in COMPONENTS}

    choice, rate = fit_fractions_to_budget(table, budget_params, fractions, 0.0, 1.0 + lam)
    return Allocation("owl", choice, {"rate": rate, "outlier_ratio": ratio.round(6).tolist()})
