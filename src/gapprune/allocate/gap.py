"""GAP: the per-component options that minimise the summed capability loss under the budget."""

from __future__ import annotations

import math

import numpy as np

from gapprune.allocate.base import ALLOCATORS, Allocation, check_budget
from gapprune.allocate.knapsack import common_grain, solve_knapsack
from gapprune.allocate.signals import LayerSignals
from gapprune.allocate.table import LossTable
from gapprune.components import COMPONENTS


@ALLOCATORS.register("gap")
def gap_allocator(table: LossTable, signals: LayerSignals | None, budget_params: int) -> Allocation:
    """Exact multiple-choice knapsack over the loss table (DESIGN §4).

    Costs are divided by a grain: the gcd of the weight-only costs (multiples of `table.param_unit`). Biases
    and norms make exact costs slightly off-grain, so each is rounded *down* in grains, which can
    only under-count removals: the exact total is then checked and the budget raised by one grain
    until it is met.
    """
    if not table.measured:
        raise ValueError("the gap allocator needs a measured loss table (this one holds parameter costs only)")
    check_budget(table, budget_params)
    unit = max(table.param_unit, 1)
    weight_costs = [(table.removed[c] // unit) * unit for c in COMPONENTS]
    grain = common_grain([w.ravel() for w in weight_costs])
    groups = [(c, l) for l in range(table.n_layers) for c in COMPONENTS]
    costs = [table.removed[c][l] // grain for c, l in groups]
    losses = [table.loss[c][l] for c, l in groups]
    target = math.ceil(budget_params / grain)
    most = int(sum(int(np.max(c)) for c in costs))
    while True:
        picks = solve_knapsack(costs, losses, min(target, most))
        choice = {c: [0] * table.n_layers for c in COMPONENTS}
        for (c, l), k in zip(groups, picks):
            choice[c][l] = k
        allocation = Allocation("gap", choice, {"grain": grain, "dp_states": target + 1})
        if allocation.removed_params(table) >= budget_params or target >= most:
            return allocation
        target += 1
