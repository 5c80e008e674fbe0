from __future__ import annotations

import itertools

import numpy as np
import pytest

from gapprune.allocate.knapsack import InfeasibleBudget, common_grain, solve_knapsack


def brute_force(costs, losses, budget):
    best = None
    for combo in itertools.product(*[range(len(c)) for c in costs]):
        if sum(costs[g][k] for g, k in enumerate(combo)) >= budget:
            value = sum(losses[g][k] for g, k in enumerate(combo))
            best = value if best is None else min(best, value)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_dp_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    groups = int(rng.integers(1, 6))
    costs = [rng.integers(0, 7, size=int(rng.integers(1, 5))) for _ in range(groups)]
    costs[0][0] = 0  # an option with zero cost
    losses = [rng.normal(size=c.size) for c in costs]  # any sign, not monotone in cost
    budget = int(rng.integers(0, sum(int(c.max()) for c in costs) + 1))
    picks = solve_knapsack(costs, losses, budget)
    assert sum(int(costs[g][k]) for g, k in enumerate(picks)) >= budget
    assert sum(losses[g][k] for g, k in enumerate(picks)) == pytest.approx(brute_force(costs, losses, budget))


def test_infeasible_budget_raises():
    with pytest.raises(InfeasibleBudget, match="exceeds"):
        solve_knapsack([np.array([0, 3]), np.array([0, 2])], [np.zeros(2), np.zeros(2)], 6)


def test_zero_budget_picks_cheapest_loss():
    picks = solve_knapsack([np.array([0, 5]), np.array([0, 1])], [np.array([1.0, -2.0]), np.array([0.0, 0.5])], 0)
    assert picks == [1, 0]


def test_seven_b_shaped_instance_is_solved_and_meets_budget():
    rng = np.random.default_rng(0)
    costs, losses = [], []
    for _ in range(32):  # 7B: 32 heads of 4*128*4096, MLP 11008 in 32 steps of 344; grain 32768
        costs += [np.arange(33) * 64, np.arange(33) * 129]
        losses += [np.sort(rng.random(33)), np.sort(rng.random(33))]
    budget = 6_738_415_616 // 32768 // 2
    picks = solve_knapsack(costs, losses, budget)
    assert sum(int(c[k]) for c, k in zip(costs, picks)) >= budget
    assert len(picks) == 64


def test_common_grain():
    assert common_grain([np.array([0, 12, 18]), np.array([24])]) == 6
    assert common_grain([np.array([0])]) == 1
