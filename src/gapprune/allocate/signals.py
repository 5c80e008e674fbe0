"""Per-layer numeric signals that baseline allocators read instead of the model.

Profiling computes them (`profiling/signals.py`) and hands them over as numbers, so every
allocator is a pure function of `(table, signals, budget)` and the whole bundle saves to JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from gapprune.values import JsonValue


@dataclass
class LayerSignals(JsonValue):
    """block_influence: (n_layers,) ShortGPT's 1 − cos(input, output) per layer (`depth`);
    outlier_ratio: (n_layers,) OWL's share of outlier Wanda scores per layer (`owl`);
    unit_scores[c][layer]: (n_units,) importance scores of that component's units (`global`)."""

    file_kind: ClassVar[str] = "signals file"

    block_influence: np.ndarray | None = None
    outlier_ratio: np.ndarray | None = None
    unit_scores: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def require(self, name: str, allocator: str) -> Any:
        value = getattr(self, name)
        if value is None or (isinstance(value, dict) and not value):
            raise ValueError(f"the {allocator} allocator needs the {name} signal; compute the signals with "
                             "calibrate.layer_signals() (the pipeline does) or load a profile that has them")
        return value

    def to_dict(self) -> dict[str, Any]:
        def array(v: np.ndarray | None) -> list[float] | None:
            return None if v is None else [float(x) for x in v]

        return {
            "block_influence": array(self.block_influence),
            "outlier_ratio": array(self.outlier_ratio),
            "unit_scores": {c: [array(v) for v in per] for c, per in self.unit_scores.items()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LayerSignals:
        def array(v: list[float] | None) -> np.ndarray | None:
            return None if v is None else np.asarray(v, dtype=np.float64)

        return cls(
            block_influence=array(data.get("block_influence")),
            outlier_ratio=array(data.get("outlier_ratio")),
            unit_scores={c: [np.asarray(v, dtype=np.float64) for v in per]
                         for c, per in data.get("unit_scores", {}).items()},
        )

