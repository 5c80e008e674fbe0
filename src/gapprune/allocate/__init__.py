"""Allocators decide how many units each component loses under a parameter budget, from numbers only.

To add one, write `fn(table: LossTable, signals: LayerSignals | None, budget_params: int) -> Allocation`
in a module here, decorate it with `@ALLOCATORS.register("name")`, and import the module below. If it
needs a per-layer signal that is not in `LayerSignals` yet, add the field there and compute it in
`profiling/signals.py`: nothing in this package may import the model, calibration or replay code.
"""

from gapprune.allocate import baselines as _baselines  # noqa: F401  (registers uniform, global, depth, owl)
from gapprune.allocate import gap as _gap  # noqa: F401  (registers gap)
from gapprune.allocate.base import ALLOCATORS, Allocation, Allocator
from gapprune.allocate.knapsack import InfeasibleBudget, solve_knapsack
from gapprune.allocate.signals import LayerSignals
from gapprune.allocate.table import LossTable

__all__ = ["ALLOCATORS", "Allocation", "Allocator", "InfeasibleBudget", "LayerSignals", "LossTable", "solve_knapsack"]
