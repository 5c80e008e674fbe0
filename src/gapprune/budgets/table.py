"""`RuntimeCosts`: per layer option, its decode time, prompt time and memory in a target runtime.

Numbers only (no model, no runtime), so the table saves beside a profile, loads back, and feeds the
knapsack. Times are microseconds per token at batch 1 (decode) or per prompt token (prefill);
bytes are weights at the table's GGUF type plus KV-cache bytes per context cell. `fixed` holds what
no option changes (embedding, head, per-token overheads). The `key` says which machine, model, GGUF
type and thread count the numbers belong to: a table is reused only where its key matches.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

import numpy as np

from gapprune.budgets.dims import ModelDims
from gapprune.budgets.memory import kv_cells
from gapprune.components import COMPONENTS
from gapprune.values import JsonValue

KINDS = ("decode_us", "prompt_us", "weight_bytes", "kv_bytes_per_cell")


@dataclass
class RuntimeCosts(JsonValue):
    """Cost of every option: cost[kind][c] is (n_layers, n_options), options as in the loss table.

    `fixed[kind]` is the part no option changes; `fit` records how the times were obtained (grid,
    coefficients, held-out errors) so a report can say how far to trust them.
    """

    file_kind: ClassVar[str] = "runtime cost table"

    key: dict[str, Any]
    dims: ModelDims
    options: dict[str, list[list[int]]]
    cost: dict[str, dict[str, np.ndarray]]
    fixed: dict[str, float]
    fit: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for kind in KINDS:
            for c in COMPONENTS:
                shape = self.cost[kind][c].shape
                if shape != (self.dims.n_layers, len(self.options[c])):
                    raise ValueError(f"runtime costs: {kind}/{c} has shape {shape}, expected "
                                     f"({self.dims.n_layers}, {len(self.options[c])})")
                if (self.cost[kind][c] < 0).any():
                    raise ValueError(f"runtime costs: {kind}/{c} has negative entries")

    def total(self, kind: str, choice: dict[str, list[int]], context: int = 0) -> float:
        """The whole model's cost for one option per component: µs per token, or bytes at `context`."""
        if kind == "memory_bytes":
            cells = kv_cells(context)
            return self.total("weight_bytes", choice) + cells * self.total("kv_bytes_per_cell", choice)
        per_layer = self.per_layer(kind, choice)
        return float(self.fixed.get(kind, 0.0) + sum(sum(row.values()) for row in per_layer))

    def per_layer(self, kind: str, choice: dict[str, list[int]]) -> list[dict[str, float]]:
        """cost[kind] of each layer's chosen options, per component (for reports and plots)."""
        return [{c: float(self.cost[kind][c][l, choice[c][l]]) for c in COMPONENTS} for l in range(self.dims.n_layers)]

    def removable(self, kind: str, context: int = 0) -> dict[str, np.ndarray]:
        """Per option, how much it removes against the dense option 0 (memory at `context`)."""
        if kind == "memory_bytes":
            cells = kv_cells(context)
            cost = {c: self.cost["weight_bytes"][c] + cells * self.cost["kv_bytes_per_cell"][c] for c in COMPONENTS}
        else:
            cost = self.cost[kind]
        return {c: cost[c][:, :1] - cost[c] for c in COMPONENTS}

    def dense_choice(self) -> dict[str, list[int]]:
        return {c: [0] * self.dims.n_layers for c in COMPONENTS}

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "dims": asdict(self.dims), "options": self.options,
                "cost": {k: {c: v.tolist() for c, v in per.items()} for k, per in self.cost.items()},
                "fixed": self.fixed, "fit": self.fit}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RuntimeCosts:
        return cls(data["key"], ModelDims(**data["dims"]), {c: [list(o) for o in v] for c, v in data["options"].items()},
                   {k: {c: np.asarray(v, dtype=np.float64) for c, v in per.items()} for k, per in data["cost"].items()},
                   {k: float(v) for k, v in data["fixed"].items()}, data.get("fit", {}))
