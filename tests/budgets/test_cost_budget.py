"""The exact DP under non-parameter costs (time, bytes): brute force agrees, budgets are met or refused."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from gapprune.allocate.cost_budget import solve_cost_budget, total_removed
from gapprune.allocate.knapsack import InfeasibleBudget
from gapprune.allocate.table import LossTable

COMPONENTS = ("attn", "mlp")


def random_instance(seed: int, n_layers: int = 3, k_attn: int = 3, k_mlp: int = 4) -> tuple[LossTable, dict]:
    """A loss table plus float savings that are not multiples of any grain (like µs per token)."""
    rng = np.random.default_rng(seed)
    options = {"attn": [[k] for k in range(k_attn)], "mlp": [[k] for k in range(k_mlp)]}
    loss = {c: np.hstack([np.zeros((n_layers, 1)), rng.uniform(0, 1, (n_layers, len(options[c]) - 1))])
            for c in COMPONENTS}
    saved = {c: np.hstack([np.zeros((n_layers, 1)), rng.uniform(0, 50, (n_layers, len(options[c]) - 1))])
             for c in COMPONENTS}
    params = {c: np.zeros((n_layers, len(options[c])), dtype=np.int64) for c in COMPONENTS}
    return LossTable("kl", "test", options, loss, params), saved


def brute_force(table: LossTable, saved: dict, budget: float) -> float:
    rows = [(c, l) for l in range(table.n_layers) for c in COMPONENTS]
    best = np.inf
    for picks in itertools.product(*(range(len(table.options[c])) for c, _ in rows)):
        if sum(saved[c][l, k] for (c, l), k in zip(rows, picks)) >= budget:
            best = min(best, sum(table.loss[c][l, k] for (c, l), k in zip(rows, picks)))
    return best


@pytest.mark.parametrize("seed", range(12))
def test_dp_with_time_costs_matches_brute_force(seed: int) -> None:
    table, saved = random_instance(seed)
    most = sum(saved[c].max(axis=1).sum() for c in COMPONENTS)
    budget = float(np.random.default_rng(seed + 100).uniform(0.1, 0.9) * most)
    allocation = solve_cost_budget(table, saved, budget, grain=0.01, unit="us")
    assert total_removed(saved, allocation.choice) >= budget  # the exact float budget is met
    assert allocation.predicted_loss(table) == pytest.approx(brute_force(table, saved, budget), abs=1e-9)


def test_coarse_grain_still_meets_the_exact_budget() -> None:
    """Rounding savings down to a coarse grain under-counts; the budget is still met, and the plan is
    no worse than the best one that saves n_rows grains more (every such plan is feasible after rounding)."""
    table, saved = random_instance(3)
    grain, n_rows = 7.0, 2 * table.n_layers
    budget = 0.6 * sum(saved[c].max(axis=1).sum() for c in COMPONENTS)
    allocation = solve_cost_budget(table, saved, budget, grain=grain)
    assert total_removed(saved, allocation.choice) >= budget
    looser = brute_force(table, saved, (math.ceil(budget / grain) + n_rows) * grain)
    assert np.isfinite(looser)  # the bound is a real plan, not "nothing reachable"
    assert brute_force(table, saved, budget) - 1e-12 <= allocation.predicted_loss(table) <= looser + 1e-12


def test_unreachable_budget_names_the_reachable_range() -> None:
    table, saved = random_instance(1)
    most = sum(saved[c].max(axis=1).sum() for c in COMPONENTS)
    with pytest.raises(InfeasibleBudget, match=r"reachable: 0 to [0-9,.]+ us"):
        solve_cost_budget(table, saved, most * 1.01, grain=0.1, unit="us")
