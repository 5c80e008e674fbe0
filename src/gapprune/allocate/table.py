"""The loss table: ΔL and parameter cost of every option of every component (DESIGN §3), as numbers.

Profilers produce it, allocators read it. It holds no model and no tensors, so it saves to JSON,
loads back, and can be measured in pieces: `exact[c]` says which entries were measured on the full
exact metric (the others are estimates: Fisher, fewer tokens, interpolation).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from gapprune.values import JsonValue


@dataclass
class LossTable(JsonValue):
    """ΔL and parameter cost of every option of every component.

    options[c]: option descriptors shared by all layers ([g, q] or [channels]);
    loss[c], removed[c]: (n_layers, n_options) arrays of ΔL and parameters removed;
    exact[c]: (n_layers, n_options) bool, True where loss[c] was measured exactly (None: all are);
    param_unit: every weight cost is a multiple of it (the hidden size; biases aside), for the DP grain.
    """

    file_kind: ClassVar[str] = "loss table"

    metric: str
    criterion: str
    options: dict[str, list[list[int]]]
    loss: dict[str, np.ndarray]
    removed: dict[str, np.ndarray]
    meta: dict[str, Any] = field(default_factory=dict)
    exact: dict[str, np.ndarray] | None = None
    param_unit: int = 1

    def __post_init__(self) -> None:
        if self.exact is None:
            self.exact = {c: np.ones(v.shape, dtype=bool) for c, v in self.loss.items()}
        for c in self.loss:
            if self.loss[c].shape != self.removed[c].shape or self.exact[c].shape != self.loss[c].shape:
                raise ValueError(f"loss table: loss, removed and exact of {c!r} need the same shape")
            if self.loss[c].shape[1] != len(self.options[c]):
                raise ValueError(f"loss table: {c!r} has {len(self.options[c])} options but "
                                 f"{self.loss[c].shape[1]} columns")

    @property
    def n_layers(self) -> int:
        return int(self.loss["attn"].shape[0])

    @property
    def measured(self) -> bool:
        """False for a cost-only table (allocators that do not read ΔL)."""
        return bool(self.meta.get("measured", True))

    def n_exact(self) -> int:
        assert self.exact is not None
        return int(sum(int(v.sum()) for v in self.exact.values()))

    def chosen_exact(self, choice: dict[str, list[int]]) -> dict[str, int]:
        """How many of a plan's picks (option index per component and layer) are exact ΔL values.

        Options that remove nothing count as exact: their ΔL is 0 by definition, never measured."""
        assert self.exact is not None
        picks = [(c, layer, k) for c, ks in choice.items() for layer, k in enumerate(ks)]
        exact = sum(1 for c, layer, k in picks if self.removed[c][layer, k] == 0 or bool(self.exact[c][layer, k]))
        return {"exact": exact, "chosen": len(picks)}

    def copy(self) -> LossTable:
        assert self.exact is not None
        return LossTable(self.metric, self.criterion, {c: [list(o) for o in v] for c, v in self.options.items()},
                         {c: v.copy() for c, v in self.loss.items()}, {c: v.copy() for c, v in self.removed.items()},
                         dict(self.meta), {c: v.copy() for c, v in self.exact.items()}, self.param_unit)

    def to_dict(self) -> dict[str, Any]:
        assert self.exact is not None
        return {
            "metric": self.metric,
            "criterion": self.criterion,
            "param_unit": self.param_unit,
            "options": self.options,
            "loss": {c: v.tolist() for c, v in self.loss.items()},
            "removed": {c: v.tolist() for c, v in self.removed.items()},
            "exact": {c: v.astype(int).tolist() for c, v in self.exact.items()},
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LossTable:
        exact = data.get("exact")
        return cls(
            metric=data["metric"],
            criterion=data["criterion"],
            options={c: [list(o) for o in v] for c, v in data["options"].items()},
            loss={c: np.asarray(v, dtype=np.float64) for c, v in data["loss"].items()},
            removed={c: np.asarray(v, dtype=np.int64) for c, v in data["removed"].items()},
            meta=data.get("meta", {}),
            exact=None if exact is None else {c: np.asarray(v, dtype=bool) for c, v in exact.items()},
            param_unit=int(data.get("param_unit", 1)),
        )

