"""Exact multiple-choice knapsack by dynamic programming (pure numpy; no torch).

Each group (one component of one layer) offers options with an integer cost (parameters removed,
in units of a common grain) and a loss. Choose exactly one option per group so that the total cost
is at least `budget` and the total loss is minimal. Costs beyond the budget are worth nothing more,
so the DP state saturates at the budget: the table is (groups) x (budget + 1), not x (everything
prunable + 1), which keeps 7B-sized instances in milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import reduce

import numpy as np


class InfeasibleBudget(ValueError):
    """The budget asks for more than removing everything prunable would give."""


def common_grain(costs: Sequence[np.ndarray]) -> int:
    """Greatest common divisor of every non-zero cost (at least 1)."""
    values = [int(c) for arr in costs for c in np.asarray(arr).ravel() if int(c) > 0]
    return reduce(math.gcd, values, 0) or 1


def solve_knapsack(costs: Sequence[np.ndarray], losses: Sequence[np.ndarray], budget: int) -> list[int]:
    """Indices of the chosen option per group: Σ cost >= budget with minimal Σ loss.

    Args:
        costs: per group, (K_g,) non-negative ints.
        losses: per group, (K_g,) finite floats (any sign, not necessarily monotone).
        budget: the minimal total cost, in the same integer units.
    Raises:
        InfeasibleBudget: when Σ_g max cost < budget.
    """
    if len(costs) != len(losses):
        raise ValueError("costs and losses need one entry per group")
    costs = [np.asarray(c, dtype=np.int64) for c in costs]
    losses = [np.asarray(v, dtype=np.float64) for v in losses]
    for group_cost, v in zip(costs, losses):
        if group_cost.shape != v.shape or group_cost.ndim != 1 or group_cost.size == 0:
            raise ValueError("each group needs matching 1-D cost and loss arrays with at least one option")
        if (group_cost < 0).any():
            raise ValueError("costs must be non-negative")
        if not np.isfinite(v).all():
            raise ValueError("losses must be finite")
    budget = max(int(budget), 0)
    most = int(sum(int(c.max()) for c in costs))
    if most < budget:
        raise InfeasibleBudget(f"budget {budget} exceeds the most that can be removed ({most})")

    width = budget + 1
    best = np.full(width, np.inf)
    best[0] = 0.0
    choice = np.zeros((len(costs), width), dtype=np.int32)  # option chosen to reach state j
    origin = np.zeros((len(costs), width), dtype=np.int64)  # state before that choice
    states = np.arange(width)
    for g, (cost, loss) in enumerate(zip(costs, losses)):
        new = np.full(width, np.inf)
        new_choice = np.zeros(width, dtype=np.int32)
        new_origin = np.zeros(width, dtype=np.int64)
        for k in range(cost.size):  # in place, strict improvements only: the first of equal options stays
            c = int(cost[k])
            if c < width:  # state j from state j - c
                cand = best[: width - c] + loss[k]
                better = cand < new[c:]
                np.copyto(new[c:], cand, where=better)
                np.copyto(new_choice[c:], k, where=better)
                np.copyto(new_origin[c:], states[: width - c], where=better)
            lowest = max(budget - c, 0)  # the budget's state from any state at or above budget - c: costs
            j = lowest + int(np.argmin(best[lowest:]))  # beyond the budget are worth nothing more
            if best[j] + loss[k] < new[budget]:
                new[budget], new_choice[budget], new_origin[budget] = best[j] + loss[k], k, j
        best, choice[g], origin[g] = new, new_choice, new_origin
    if not np.isfinite(best[budget]):
        raise InfeasibleBudget(f"no combination of options reaches the budget {budget}")
    picks = [0] * len(costs)
    state = budget
    for g in range(len(costs) - 1, -1, -1):
        picks[g] = int(choice[g, state])
        state = int(origin[g, state])
    return picks
