"""Budgets in the units users deploy against, turned into "remove at least X" for the knapsack.

* speedup s: decode time per token at most T_dense / s, so remove at least T_dense·(1 − 1/s) µs
  (T_dense includes the fixed part: embedding, head and per-token overheads, which no option shrinks);
* max memory M at a context of C tokens: weights + KV cache at most M, so remove at least
  (dense bytes at C) − M.
Times are quantised to `TIME_GRAIN_US` (0.1 µs) and bytes to `MEMORY_GRAIN` (1 KiB) for the DP; the
exact float totals are checked afterwards (`allocate/cost_budget.py`).
"""

from __future__ import annotations

import re

from gapprune.allocate.base import Allocation
from gapprune.allocate.cost_budget import reachable, solve_cost_budget
from gapprune.allocate.knapsack import InfeasibleBudget
from gapprune.allocate.table import LossTable
from gapprune.budget import Budget
from gapprune.budgets.table import RuntimeCosts

__all__ = ["achieved", "allocate_budget", "check_reachable", "parse_size", "reachable_range"]

TIME_GRAIN_US = 0.1
MEMORY_GRAIN = 1024
_SIZE = re.compile(r"^\s*([0-9.]+)\s*([kmg]i?b?|b)?\s*$", re.IGNORECASE)
_FACTORS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "k": 10**3, "m": 10**6, "g": 10**9,
            "kib": 2**10, "mib": 2**20, "gib": 2**30, "ki": 2**10, "mi": 2**20, "gi": 2**30}


def parse_size(text: str) -> int:
    """Bytes in '250MB', '250 MiB', '0.25GB' or a plain number of bytes (MB = 10^6, MiB = 2^20)."""
    match = _SIZE.match(str(text))
    if not match or (match.group(2) or "").lower() not in _FACTORS:
        raise ValueError(f"cannot read the size {text!r}; write it like 250MB, 240MiB or 250000000")
    return round(float(match.group(1)) * _FACTORS[(match.group(2) or "").lower()])


def cost_kind(budget: Budget) -> str:
    """The runtime cost a speedup or memory budget is counted in."""
    return "decode_us" if budget.kind == "speedup" else "memory_bytes"


def dense_cost(budget: Budget, costs: RuntimeCosts) -> float:
    """The dense model's decode µs per token, or its bytes at the budget's context."""
    return costs.total(cost_kind(budget), costs.dense_choice(), budget.context)


def to_remove(budget: Budget, costs: RuntimeCosts) -> float:
    """The least saving, in µs per token or bytes, that meets a runtime budget."""
    dense = dense_cost(budget, costs)
    return dense * (1 - 1 / budget.target) if budget.kind == "speedup" else dense - budget.target


def achieved(budget: Budget, costs: RuntimeCosts, choice: dict[str, list[int]]) -> float:
    """The plan's predicted speedup, or its predicted bytes at the budget's context."""
    value = costs.total(cost_kind(budget), choice, budget.context)
    return dense_cost(budget, costs) / value if budget.kind == "speedup" else value


def reachable_range(budget: Budget, costs: RuntimeCosts) -> tuple[float, float]:
    """(least, most) achievable: speedups from 1 to everything pruned; bytes from everything pruned to dense."""
    dense = dense_cost(budget, costs)
    most = reachable(costs.removable(cost_kind(budget), budget.context))
    return (1.0, dense / (dense - most)) if budget.kind == "speedup" else (dense - most, dense)


def check_reachable(budget: Budget, costs: RuntimeCosts) -> None:
    """Refuse a speedup or memory size that no plan reaches, with the range that can be reached: known from
    the cost table alone, so the CLI says it before profiling."""
    low, high = reachable_range(budget, costs)
    if (budget.kind == "speedup" and budget.target > high) or (budget.kind == "memory" and budget.target < low):
        raise InfeasibleBudget(f"the {budget.kind} budget {budget.describe(budget.target)} cannot be reached: "
                               f"this model reaches {budget.describe(low)} to {budget.describe(high)} "
                               f"(costs for {costs.key.get('runtime')} {costs.key.get('file_type')})")


def allocate_budget(table: LossTable, costs: RuntimeCosts, budget: Budget) -> Allocation:
    """GAP's exact DP over the loss table with the runtime costs; refuses an unreachable budget with the range."""
    if not budget.in_runtime:
        raise ValueError(f"a {budget.kind} budget is solved in parameters, not with a runtime's costs")
    if [list(o) for o in costs.options["attn"]] != table.options["attn"] or \
            [list(o) for o in costs.options["mlp"]] != table.options["mlp"]:
        raise ValueError("the cost table was measured for other options than the loss table's; measure it again")
    check_reachable(budget, costs)
    grain = TIME_GRAIN_US if budget.kind == "speedup" else MEMORY_GRAIN
    unit = "us/token" if budget.kind == "speedup" else "bytes"
    allocation = solve_cost_budget(table, costs.removable(cost_kind(budget), budget.context),
                                   max(to_remove(budget, costs), 0.0), grain, unit, name=f"gap-{budget.kind}")
    allocation.info.update({"budget": budget.to_record(), "predicted": achieved(budget, costs, allocation.choice),
                            "dense": dense_cost(budget, costs)})
    return allocation
