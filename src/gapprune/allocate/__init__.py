"""Allocators decide how many units each component loses under a parameter budget.

To add one, write `fn(context: AllocationContext, budget_params: int) -> Allocation` in a module
here, decorate it with `@ALLOCATORS.register("name")`, and import the module below.
"""

from gapprune.allocate import baselines as _baselines  # noqa: F401  (registers uniform, global, depth, owl)
from gapprune.allocate import gap as _gap  # noqa: F401  (registers gap)
from gapprune.allocate.base import ALLOCATORS, Allocation, AllocationContext
from gapprune.allocate.knapsack import InfeasibleBudget, solve_knapsack

__all__ = ["ALLOCATORS", "Allocation", "AllocationContext", "InfeasibleBudget", "solve_knapsack"]
