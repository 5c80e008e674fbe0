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
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from gapprune.allocate.base import Allocation
from gapprune.allocate.cost_budget import reachable, solve_cost_budget
from gapprune.allocate.knapsack import InfeasibleBudget
from gapprune.allocate.table import LossTable
from gapprune.budgets.table import RuntimeCosts

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


@dataclass(frozen=True)
class Budget:
    """What the user asks for: a decode speedup, or a memory ceiling at a context length."""

    kind: str  # "speedup" | "memory"
    target: float  # the speedup factor, or the bytes
    context: int = 0  # tokens of context the memory must hold

    def __post_init__(self) -> None:
        match self.kind:
            case "speedup":
                if self.target < 1:
                    raise ValueError(f"a speedup must be at least 1, got {self.target}")
            case "memory":
                if self.target <= 0 or self.context <= 0:
                    raise ValueError("a memory budget needs positive bytes and a positive context")
            case _:
                raise ValueError(f"budget kind must be speedup or memory, got {self.kind!r}")

    @property
    def cost_kind(self) -> str:
        return "decode_us" if self.kind == "speedup" else "memory_bytes"

    def dense(self, costs: RuntimeCosts) -> float:
        return costs.total(self.cost_kind, costs.dense_choice(), self.context)

    def to_remove(self, costs: RuntimeCosts) -> float:
        """The least saving, in µs per token or bytes, that meets the budget."""
        dense = self.dense(costs)
        return dense * (1 - 1 / self.target) if self.kind == "speedup" else dense - self.target

    def describe(self, value: float) -> str:
        if self.kind == "speedup":
            return f"{value:.3f}x"
        size = f"{value / 1e6:.2f} MB" if abs(value) >= 1e6 else f"{value / 1e3:.2f} kB"  # 1KB is not "0.00 MB"
        return f"{size} at {self.context} tokens"

    def to_record(self) -> dict[str, Any]:
        return asdict(self)


def achieved(budget: Budget, costs: RuntimeCosts, choice: dict[str, list[int]]) -> float:
    """The plan's predicted speedup, or its predicted bytes at the budget's context."""
    value = costs.total(budget.cost_kind, choice, budget.context)
    return budget.dense(costs) / value if budget.kind == "speedup" else value


def reachable_range(budget: Budget, costs: RuntimeCosts) -> tuple[float, float]:
    """(least, most) achievable: speedups from 1 to everything pruned; bytes from everything pruned to dense."""
    dense = budget.dense(costs)
    most = reachable(costs.removable(budget.cost_kind, budget.context))
    return (1.0, dense / (dense - most)) if budget.kind == "speedup" else (dense - most, dense)


def allocate_budget(table: LossTable, costs: RuntimeCosts, budget: Budget) -> Allocation:
    """GAP's exact DP over the loss table with the runtime costs; refuses an unreachable budget with the range."""
    if [list(o) for o in costs.options["attn"]] != table.options["attn"] or \
            [list(o) for o in costs.options["mlp"]] != table.options["mlp"]:
        raise ValueError("the cost table was measured for other options than the loss table's; measure it again")
    low, high = reachable_range(budget, costs)
    if (budget.kind == "speedup" and budget.target > high) or (budget.kind == "memory" and budget.target < low):
        raise InfeasibleBudget(f"the {budget.kind} budget {budget.describe(budget.target)} cannot be reached: "
                               f"this model reaches {budget.describe(low)} to {budget.describe(high)} "
                               f"(costs for {costs.key.get('runtime')} {costs.key.get('file_type')})")
    grain = TIME_GRAIN_US if budget.kind == "speedup" else MEMORY_GRAIN
    unit = "us/token" if budget.kind == "speedup" else "bytes"
    allocation = solve_cost_budget(table, costs.removable(budget.cost_kind, budget.context),
                                   max(budget.to_remove(costs), 0.0), grain, unit, name=f"gap-{budget.kind}")
    allocation.info.update({"budget": budget.to_record(), "predicted": achieved(budget, costs, allocation.choice),
                            "dense": budget.dense(costs)})
    return allocation


def runtime_allocator(costs: RuntimeCosts, budget: Budget) -> Callable[[Any], Allocation]:
    """For `pipeline.plan_for(..., allocate_with=...)`: the profile's loss table under this budget."""
    return lambda profile: allocate_budget(profile.table, costs, budget)
