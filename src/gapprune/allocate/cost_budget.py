"""GAP under any additive cost: time, memory, parameters. The same exact knapsack, other units.

`removed[c]` (n_layers, n_options) is what each option saves against the dense one, in any unit
(microseconds per token, bytes). The DP needs integers, so every saving is divided by `grain` and
rounded down (negative savings clip to 0: an option that costs more is never credited). Rounding
down can only under-count, so the exact float total is checked afterwards and the integer target
raised by the shortfall until the exact budget is met: the answer is exact for the rounded
costs and never misses the budget.
"""

from __future__ import annotations

import math

import numpy as np

from gapprune.allocate.base import Allocation
from gapprune.allocate.knapsack import InfeasibleBudget, solve_knapsack
from gapprune.allocate.table import LossTable
from gapprune.components import COMPONENTS


def reachable(removed: dict[str, np.ndarray]) -> float:
    """The most any choice of options removes (each component at its largest saving)."""
    return float(sum(np.maximum(removed[c], 0).max(axis=1).sum() for c in COMPONENTS))


def total_removed(removed: dict[str, np.ndarray], choice: dict[str, list[int]]) -> float:
    return float(sum(removed[c][l, k] for c in COMPONENTS for l, k in enumerate(choice[c])))


def solve_cost_budget(table: LossTable, removed: dict[str, np.ndarray], budget: float, grain: float,
                      unit: str = "", name: str = "gap-cost") -> Allocation:
    """Options minimising Σ ΔL such that Σ removed >= budget (same DP as `gap`, other costs).

    Args:
        table: the loss table (ΔL per option).
        removed: per component, (n_layers, n_options) savings in `unit`, same layout as `table.loss`.
        budget: the least total saving, in `unit`.
        grain: the DP's integer step, in `unit` (e.g. 1 µs, 4 KiB).
    Raises:
        InfeasibleBudget: when even the largest saving falls short; the message gives the reachable range.
    """
    if grain <= 0:
        raise ValueError(f"grain must be positive, got {grain}")
    for c in COMPONENTS:
        if removed[c].shape != table.loss[c].shape:
            raise ValueError(f"removed[{c!r}] has shape {removed[c].shape}, the loss table {table.loss[c].shape}")
    most = reachable(removed)
    if budget > most:
        raise InfeasibleBudget(f"the budget asks to remove {budget:,.1f} {unit} but this cost table reaches at most "
                               f"{most:,.1f} {unit} (reachable: 0 to {most:,.1f} {unit} removed)")
    groups = [(c, l) for l in range(table.n_layers) for c in COMPONENTS]
    costs = [np.floor(np.maximum(removed[c][l], 0) / grain).astype(np.int64) for c, l in groups]
    losses = [table.loss[c][l] for c, l in groups]
    int_most = int(sum(int(x.max()) for x in costs))
    target = min(max(math.ceil(budget / grain), 0), int_most)
    while True:
        picks = solve_knapsack(costs, losses, target)
        choice = {c: [0] * table.n_layers for c in COMPONENTS}
        for (c, l), k in zip(groups, picks):
            choice[c][l] = k
        exact = total_removed(removed, choice)
        if exact >= budget or target >= int_most:
            break
        target = min(target + max(1, math.ceil((budget - exact) / grain)), int_most)
    if exact < budget:
        raise InfeasibleBudget(f"no choice removes {budget:,.1f} {unit} (best reached {exact:,.1f} {unit})")
    info = {"budget": budget, "removed": exact, "unit": unit, "grain": grain, "dp_states": target + 1}
    return Allocation(name, choice, info)
