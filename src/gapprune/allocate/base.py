"""The allocator contract: `allocator(table, signals, budget_params) -> Allocation`, numbers in and out.

Every allocator picks among the same options as the loss table (DESIGN §1), so all of them are
compared on equal terms: the same criterion decides *which* units go, the allocator decides *how many*.
Allocators never see the model: what they read beyond the table arrives as `LayerSignals`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from gapprune.allocate.knapsack import InfeasibleBudget
from gapprune.allocate.signals import LayerSignals
from gapprune.allocate.table import LossTable
from gapprune.components import COMPONENTS
from gapprune.registry import Registry
from gapprune.values import JsonValue


@dataclass
class Allocation(JsonValue):
    """choice[c][layer] = index into table.options[c]."""

    file_kind: ClassVar[str] = "allocation"
    json_indent: ClassVar[int | None] = 1

    allocator: str
    choice: dict[str, list[int]]
    info: dict[str, Any] = field(default_factory=dict)

    def options(self, table: LossTable) -> list[dict[str, list[int]]]:
        return [{c: table.options[c][self.choice[c][l]] for c in COMPONENTS} for l in range(table.n_layers)]

    def losses(self, table: LossTable) -> list[dict[str, float]]:
        return [{c: float(table.loss[c][l, self.choice[c][l]]) for c in COMPONENTS} for l in range(table.n_layers)]

    def removed_params(self, table: LossTable) -> int:
        return int(sum(table.removed[c][l, self.choice[c][l]] for c in COMPONENTS for l in range(table.n_layers)))

    def predicted_loss(self, table: LossTable) -> float:
        return float(sum(v for per in self.losses(table) for v in per.values()))

    def to_dict(self) -> dict[str, Any]:
        return {"allocator": self.allocator, "choice": self.choice, "info": self.info}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Allocation:
        return cls(data["allocator"], {c: [int(k) for k in v] for c, v in data["choice"].items()}, data.get("info", {}))



Allocator = Callable[[LossTable, LayerSignals | None, int], Allocation]
ALLOCATORS: Registry[Allocator] = Registry("allocator")


def check_budget(table: LossTable, budget_params: int) -> None:
    prunable = int(sum(table.removed[c].max(axis=1).sum() for c in COMPONENTS))
    if budget_params > prunable:
        raise InfeasibleBudget(
            f"the budget asks to remove {budget_params:,} parameters but at most {prunable:,} are prunable "
            "(embeddings, LM head and final norm are never pruned); lower the ratio"
        )


def nearest_option(removed_row: np.ndarray, full: int, fraction: float) -> int:
    """Index of the option whose removed fraction of the component is closest to `fraction`."""
    target = min(max(fraction, 0.0), 1.0) * full
    return int(np.argmin(np.abs(removed_row - target)))


def fit_fractions_to_budget(
    table: LossTable, budget_params: int, fractions: Callable[[float], dict[str, np.ndarray]], lo: float, hi: float
) -> tuple[dict[str, list[int]], float]:
    """Bisect a scalar knob t so that rounding `fractions(t)` (per component, per layer) to the
    nearest options removes at least `budget_params` with the smallest such t. Returns (choice, t)."""
    full = {c: table.removed[c].max(axis=1) for c in COMPONENTS}

    def choose(t: float) -> tuple[dict[str, list[int]], int]:
        frac = fractions(t)
        choice = {
            c: [nearest_option(table.removed[c][l], int(full[c][l]), float(frac[c][l])) for l in range(table.n_layers)]
            for c in COMPONENTS
        }
        removed = sum(int(table.removed[c][l, choice[c][l]]) for c in COMPONENTS for l in range(table.n_layers))
        return choice, removed

    check_budget(table, budget_params)
    if choose(hi)[1] < budget_params:
        raise InfeasibleBudget("the allocator cannot reach the budget with its rate schedule; lower the ratio")
    for _ in range(60):
        mid = (lo + hi) / 2
        if choose(mid)[1] >= budget_params:
            hi = mid
        else:
            lo = mid
    return choose(hi)[0], hi
