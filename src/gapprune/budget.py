"""How much to remove, as one object per kind: a ratio of the model or of its decoder, a parameter count, a
decode speedup in a runtime, or a memory size at a context length.

Each kind is a class that knows how it is checked, which cost it is counted in, how its plan is solved and
how to say what a plan achieved; the rest of gapprune holds a `Budget` and asks it (SliceGPT's
`slicing_scheduler`: one object per policy, handed to the code that slices). A ratio or a parameter count is
solved in parameters from the loss table's own costs, by any allocator; a speedup or a memory size by GAP's
DP over a runtime's measured cost table (`budgets/`, measured by a registered runtime in `runtimes/`).

To add a kind: a subclass here, registered with `@budget_kind`; nothing else branches on it.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Protocol

import numpy as np

from gapprune.allocate.base import ALLOCATORS, Allocation
from gapprune.allocate.cost_budget import reachable, solve_cost_budget
from gapprune.allocate.knapsack import InfeasibleBudget
from gapprune.allocate.shards import check_sharded, shardable_table
from gapprune.allocate.signals import LayerSignals
from gapprune.allocate.table import LossTable

__all__ = ["Budget", "MemoryBudget", "ParamsBudget", "RatioBudget", "RuntimeBudget", "SpeedupBudget", "TableSolver",
           "budget_from_record", "parse_size", "reads_loss", "solver"]

DP_ALLOCATOR = "gap"  # the allocator whose DP chooses by the table's options (runtime costs, sharding, refinement)
TIME_GRAIN_US = 0.1
MEMORY_GRAIN = 1024


def reads_loss(allocator: str) -> bool:
    """Whether `allocator` chooses by the loss table's ΔL (GAP's DP); the baselines need parameter costs alone."""
    return allocator == DP_ALLOCATOR


class CostTable(Protocol):
    """What a runtime budget reads of a cost table (`budgets.table.RuntimeCosts`)."""

    key: dict[str, Any]
    options: dict[str, list[list[int]]]

    def total(self, kind: str, choice: dict[str, list[int]], context: int = 0) -> float: ...

    def removable(self, kind: str, context: int = 0) -> dict[str, np.ndarray]: ...

    def dense_choice(self) -> dict[str, list[int]]: ...


class RuntimeMeasures(Protocol):
    """What a runtime measures of a pruned model (`runtimes.base.Runtime`), one method per runtime budget."""

    def measure_speedup(self, reference: Any, folder: Any, gguf: str | None) -> Any: ...

    def measure_memory(self, context: int, folder: Any, gguf: str | None) -> Any: ...


class TableSolver:
    """A loss table's allocation under one budget; `by_options` when the DP chooses among the table's options
    (what refinement re-solves around and sharding restricts)."""

    def __init__(self, solve: Callable[[LossTable], Allocation], by_options: bool) -> None:
        self._solve = solve
        self.by_options = by_options

    def __call__(self, table: LossTable) -> Allocation:
        return self._solve(table)


_KINDS: dict[str, type[Budget]] = {}


def budget_kind(cls: type[Budget]) -> type[Budget]:
    _KINDS[cls.kind] = cls
    return cls


class Budget(ABC):
    """What the user asks for; `target` is the ratio, the parameter count, the speedup factor or the bytes."""

    kind: ClassVar[str]
    flag: ClassVar[str] = ""  # the command-line flag that asks for it
    needs_costs: ClassVar[bool] = False  # solved over a runtime's cost table
    target: float

    @abstractmethod
    def describe(self, value: float | None = None) -> str:
        """`value` (default: the target) in this budget's units."""

    @abstractmethod
    def table_solver(self, allocator: str, total_params: int, decoder_params: int, signals: LayerSignals | None,
                     costs: CostTable | None) -> TableSolver: ...

    def check_model(self, total_params: int, decoder_params: int) -> None:
        """Refuse, before any measuring, what this model cannot give (default: nothing to check)."""

    def plan_ratio(self) -> dict[str, Any]:
        """What `plan.json`'s config says of the ratio: a budget in other units claims none."""
        return {"ratio": None}

    def to_record(self) -> dict[str, Any]:
        return {"kind": self.kind, **asdict(self)}  # type: ignore[call-overload]


def budget_from_record(record: dict[str, Any]) -> Budget:
    """The budget a `plan.json` or `budget.json` recorded (`to_record`)."""
    fields = dict(record)
    kind = fields.pop("kind", None)
    if kind not in _KINDS:
        raise ValueError(f"budget kind must be one of {', '.join(_KINDS)}, got {kind!r}")
    cls = _KINDS[kind]
    names = cls.__dataclass_fields__  # type: ignore[attr-defined]
    return cls(**{k: v for k, v in fields.items() if k in names})


def _by_allocator(allocator: str, signals: LayerSignals | None, params: int) -> TableSolver:
    chosen = ALLOCATORS.get(allocator)
    return TableSolver(lambda table: chosen(table, signals, params), by_options=allocator == DP_ALLOCATOR)


@budget_kind
@dataclass(frozen=True)
class RatioBudget(Budget):
    """A fraction of the whole model's parameters, or of its decoder layers' (for models whose embedding is
    most of the weights: Gemma 3 270M's is 63%)."""

    kind: ClassVar[str] = "ratio"
    flag: ClassVar[str] = "--ratio"
    target: float
    of: str = "model"

    def __post_init__(self) -> None:
        if not 0 < self.target < 1:
            raise ValueError(f"ratio must lie strictly between 0 and 1 (a fraction of the parameters), "
                             f"got {self.target}")
        if self.of not in ("model", "decoder"):
            raise ValueError(f"a ratio is of the model or of the decoder, got {self.of!r}")

    def params(self, total_params: int, decoder_params: int = 0) -> int:
        """Parameters to remove."""
        if self.of == "decoder":
            if decoder_params <= 0:
                raise ValueError("this profile was saved before decoder parameters were counted; profile again "
                                 "to prune with ratio_of decoder")
            return round(self.target * decoder_params)
        return round(self.target * total_params)

    def check_model(self, total_params: int, decoder_params: int) -> None:
        """Refuse a ratio of the model larger than its decoder layers (all that can go): embeddings and the head
        are never pruned, so on a model whose embedding is a large share (SmolLM2: 21%) a ratio can ask too much."""
        wanted = self.params(total_params, decoder_params)
        if wanted > decoder_params:
            share = decoder_params / total_params
            raise InfeasibleBudget(f"ratio {self.target} of the model asks to remove {wanted:,} parameters, but only "
                                   f"the decoder layers can be pruned: {decoder_params:,} ({100 * share:.1f}% of the "
                                   f"model); use a ratio below {share:.2f} or a share of the decoder (--ratio-of decoder)")

    def describe(self, value: float | None = None) -> str:
        return f"{100 * (self.target if value is None else value):.2f}% of the {self.of}"

    def plan_ratio(self) -> dict[str, Any]:
        return {"ratio": self.target, "ratio_of": self.of}

    def table_solver(self, allocator: str, total_params: int, decoder_params: int, signals: LayerSignals | None,
                     costs: CostTable | None) -> TableSolver:
        return _by_allocator(allocator, signals, self.params(total_params, decoder_params))


@budget_kind
@dataclass(frozen=True)
class ParamsBudget(Budget):
    """A number of parameters to remove."""

    kind: ClassVar[str] = "params"
    target: float

    def __post_init__(self) -> None:
        if self.target < 1 or self.target != int(self.target):
            raise ValueError(f"a parameter budget is a positive whole number, got {self.target}")

    def describe(self, value: float | None = None) -> str:
        return f"{self.target if value is None else value:,.0f} parameters"

    def table_solver(self, allocator: str, total_params: int, decoder_params: int, signals: LayerSignals | None,
                     costs: CostTable | None) -> TableSolver:
        return _by_allocator(allocator, signals, int(self.target))


class RuntimeBudget(Budget):
    """A budget counted in a runtime's measured costs: "remove at least X" of its cost column, solved by the
    same exact knapsack as a ratio over those costs (`allocate/cost_budget.py`). Costs are quantised to `grain`
    for the DP; the exact float totals are checked afterwards."""

    needs_costs: ClassVar[bool] = True
    cost_column: ClassVar[str]
    grain: ClassVar[float]
    unit: ClassVar[str]
    timed: ClassVar[bool]  # whether its cost table needs timings (memory needs formulas only)
    needs_reference: ClassVar[bool]  # whether verifying needs the dense model measured beside the pruned one
    context: int = 0

    @abstractmethod
    def measure(self, runtime: RuntimeMeasures, reference: Any, folder: Any, gguf: str | None) -> Any:
        """The pruned model measured in `runtime`, in this budget's units (a `runtimes.base.Verification`)."""

    @abstractmethod
    def to_remove(self, dense: float) -> float:
        """The least saving, in the cost column's units, that meets the budget from the dense cost."""

    @abstractmethod
    def value(self, dense: float, cost: float) -> float:
        """What a plan of cost `cost` achieves, in the budget's own units."""

    @abstractmethod
    def meets(self, value: float) -> bool:
        """Whether a predicted value meets the target."""

    def verified(self, measured: float) -> bool:
        """Whether a value measured in the runtime meets the target (default: as a prediction must)."""
        return self.meets(measured)

    def dense_cost(self, costs: CostTable) -> float:
        """The dense model's cost (decode µs per token, or bytes at the budget's context)."""
        return costs.total(self.cost_column, costs.dense_choice(), self.context)

    def achieved(self, costs: CostTable, choice: dict[str, list[int]]) -> float:
        """The plan's predicted value in the budget's units."""
        return self.value(self.dense_cost(costs), costs.total(self.cost_column, choice, self.context))

    def reachable_range(self, costs: CostTable) -> tuple[float, float]:
        """(least, most) any plan achieves, in the budget's units, ordered."""
        dense = self.dense_cost(costs)
        most = reachable(costs.removable(self.cost_column, self.context))
        low, high = sorted((self.value(dense, dense), self.value(dense, dense - most)))
        return low, high

    def check_reachable(self, costs: CostTable) -> None:
        """Refuse a target no plan reaches, with the range that can be reached: known from the cost table alone,
        so the CLI says it before profiling."""
        low, high = self.reachable_range(costs)
        if not (self.meets(low) or self.meets(high)):
            raise InfeasibleBudget(f"the {self.kind} budget {self.describe()} cannot be reached: this model reaches "
                                   f"{self.describe(low)} to {self.describe(high)} "
                                   f"(costs for {costs.key.get('runtime')} {costs.key.get('file_type')})")

    def allocate(self, table: LossTable, costs: CostTable) -> Allocation:
        """GAP's exact DP over the loss table with the runtime costs."""
        if [list(o) for o in costs.options["attn"]] != table.options["attn"] or \
                [list(o) for o in costs.options["mlp"]] != table.options["mlp"]:
            raise ValueError("the cost table was measured for other options than the loss table's; measure it again")
        self.check_reachable(costs)
        dense = self.dense_cost(costs)
        allocation = solve_cost_budget(table, costs.removable(self.cost_column, self.context),
                                       max(self.to_remove(dense), 0.0), self.grain, self.unit, name=f"gap-{self.kind}")
        allocation.info.update({"budget": self.to_record(), "predicted": self.achieved(costs, allocation.choice),
                                "dense": dense})
        return allocation

    def table_solver(self, allocator: str, total_params: int, decoder_params: int, signals: LayerSignals | None,
                     costs: CostTable | None) -> TableSolver:
        if allocator != DP_ALLOCATOR:
            raise ValueError(f"a {self.kind} budget is solved by the {DP_ALLOCATOR} allocator's DP over runtime "
                             f"costs, not by {allocator}")
        if costs is None:
            raise ValueError(f"a {self.kind} budget needs the runtime's cost table (gapprune.runtimes)")
        return TableSolver(lambda table: self.allocate(table, costs), by_options=True)

    def off_target(self, measured: float) -> str:
        """How far a measured value lies from the target, for the verdict."""
        return f"{100 * (measured / self.target - 1):+.1f}% of the target"


@budget_kind
@dataclass(frozen=True)
class SpeedupBudget(RuntimeBudget):
    """Decode time per token at most T_dense / s: remove at least T_dense·(1 − 1/s) µs (T_dense includes the
    fixed part, embedding, head and per-token overheads, which no option shrinks)."""

    kind: ClassVar[str] = "speedup"
    flag: ClassVar[str] = "--speedup"
    cost_column: ClassVar[str] = "decode_us"
    grain: ClassVar[float] = TIME_GRAIN_US
    unit: ClassVar[str] = "us/token"
    timed: ClassVar[bool] = True
    needs_reference: ClassVar[bool] = True
    target: float
    context: int = 0
    tolerance: ClassVar[float] = 0.95  # a measured speedup within 5% of the target meets it (timing spread)

    def __post_init__(self) -> None:
        if self.target < 1:
            raise ValueError(f"a speedup must be at least 1, got {self.target}")

    def to_remove(self, dense: float) -> float:
        return dense * (1 - 1 / self.target)

    def value(self, dense: float, cost: float) -> float:
        return dense / cost

    def meets(self, value: float) -> bool:
        return value >= self.target

    def verified(self, measured: float) -> bool:
        return measured >= self.target * self.tolerance

    def measure(self, runtime: RuntimeMeasures, reference: Any, folder: Any, gguf: str | None) -> Any:
        return runtime.measure_speedup(reference, folder, gguf)

    def describe(self, value: float | None = None) -> str:
        return f"{self.target if value is None else value:.3f}x"


@budget_kind
@dataclass(frozen=True)
class MemoryBudget(RuntimeBudget):
    """Weights + KV cache at most M at a context of C tokens: remove at least (dense bytes at C) − M."""

    kind: ClassVar[str] = "memory"
    flag: ClassVar[str] = "--max-memory"
    cost_column: ClassVar[str] = "memory_bytes"
    grain: ClassVar[float] = MEMORY_GRAIN
    unit: ClassVar[str] = "bytes"
    timed: ClassVar[bool] = False
    needs_reference: ClassVar[bool] = False
    target: float
    context: int = 0

    def __post_init__(self) -> None:
        if self.target <= 0 or self.context <= 0:
            raise ValueError("a memory budget needs positive bytes and a positive context")

    def to_remove(self, dense: float) -> float:
        return dense - self.target

    def value(self, dense: float, cost: float) -> float:
        return cost

    def meets(self, value: float) -> bool:
        return value <= self.target

    def describe(self, value: float | None = None) -> str:
        value = self.target if value is None else value
        size = f"{value / 1e6:.2f} MB" if abs(value) >= 1e6 else f"{value / 1e3:.2f} kB"  # 1KB is not "0.00 MB"
        return f"{size} at {self.context} tokens"

    def measure(self, runtime: RuntimeMeasures, reference: Any, folder: Any, gguf: str | None) -> Any:
        return runtime.measure_memory(self.context, folder, gguf)

    def off_target(self, measured: float) -> str:  # a miss of a few hundred bytes would read "+0.0%"
        return f"{super().off_target(measured)}, {measured - self.target:+,.0f} bytes"


def solver(budget: Budget, allocator: str, total_params: int, decoder_params: int,
           signals: LayerSignals | None = None, costs: CostTable | None = None, tp: int = 1) -> TableSolver:
    """The one solve: a loss table's allocation under `budget`, by `allocator`. `tp` > 1: only options whose
    kept counts split over that many tensor-parallel ranks (a DP over the table's options only)."""
    whole = budget.table_solver(allocator, total_params, decoder_params, signals, costs)
    if tp <= 1:
        return whole
    if not whole.by_options:
        raise ValueError(f"--tp {tp} restricts GAP's DP to shardable options; the {allocator} allocator "
                         "does not choose by the table's options")

    def sharded(table: LossTable) -> Allocation:
        allocation = whole(shardable_table(table, tp))
        check_sharded(allocation.choice, table, tp)
        return allocation

    return TableSolver(sharded, by_options=True)


_SIZE = re.compile(r"^\s*([0-9.]+)\s*([kmg]i?b?|b)?\s*$", re.IGNORECASE)
_FACTORS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "k": 10**3, "m": 10**6, "g": 10**9,
            "kib": 2**10, "mib": 2**20, "gib": 2**30, "ki": 2**10, "mi": 2**20, "gi": 2**30}


def parse_size(text: str) -> int:
    """Bytes in '250MB', '250 MiB', '0.25GB' or a plain number of bytes (MB = 10^6, MiB = 2^20)."""
    match = _SIZE.match(str(text))
    if not match or (match.group(2) or "").lower() not in _FACTORS:
        raise ValueError(f"cannot read the size {text!r}; write it like 250MB, 240MiB or 250000000")
    return round(float(match.group(1)) * _FACTORS[(match.group(2) or "").lower()])
