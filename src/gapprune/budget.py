"""How much to remove, as one value: a ratio of the model or of its decoder, a parameter count, a
decode speedup in a runtime, or a memory size at a context length.

Every plan is solved from a `Budget` by one function (`pipeline.plan_for`), and the auto profiler
completes its table for that same budget, so a speed budget's DP runs on exactly what its plan needs.
A ratio or a parameter count is solved in parameters from the loss table's own costs; a speedup or a
memory size needs the runtime's measured cost table (`budgets/`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

KINDS = ("ratio", "params", "speedup", "memory")


@dataclass(frozen=True)
class Budget:
    """What the user asks for; `target` is the ratio, the parameter count, the speedup factor or the bytes."""

    kind: str  # "ratio" | "params" | "speedup" | "memory"
    target: float
    context: int = 0  # memory: tokens of context the KV cache must hold
    of: str = "model"  # ratio: a fraction of the whole model or of its decoder layers

    def __post_init__(self) -> None:
        match self.kind:
            case "ratio":
                if not 0 < self.target < 1:
                    raise ValueError(f"ratio must lie strictly between 0 and 1 (a fraction of the parameters), "
                                     f"got {self.target}")
                if self.of not in ("model", "decoder"):
                    raise ValueError(f"a ratio is of the model or of the decoder, got {self.of!r}")
            case "params":
                if self.target < 1 or self.target != int(self.target):
                    raise ValueError(f"a parameter budget is a positive whole number, got {self.target}")
            case "speedup":
                if self.target < 1:
                    raise ValueError(f"a speedup must be at least 1, got {self.target}")
            case "memory":
                if self.target <= 0 or self.context <= 0:
                    raise ValueError("a memory budget needs positive bytes and a positive context")
            case _:
                raise ValueError(f"budget kind must be one of {', '.join(KINDS)}, got {self.kind!r}")

    @classmethod
    def ratio(cls, ratio: float, of: str = "model") -> Budget:
        return cls("ratio", ratio, of=of)

    @property
    def in_runtime(self) -> bool:
        """Measured in a runtime's costs (speed, memory) rather than counted in parameters."""
        return self.kind in ("speedup", "memory")

    def params(self, total_params: int, decoder_params: int = 0) -> int:
        """Parameters to remove, for a ratio or a parameter count."""
        from gapprune.allocate.base import budget_params

        if self.kind == "params":
            return int(self.target)
        if self.kind == "ratio":
            return budget_params(total_params, self.target, decoder_params, self.of)
        raise ValueError(f"a {self.kind} budget is not a parameter count: solve it with the runtime's costs")

    def describe(self, value: float | None = None) -> str:
        value = self.target if value is None else value
        match self.kind:
            case "ratio":
                return f"{100 * value:.2f}% of the {self.of}"
            case "params":
                return f"{value:,.0f} parameters"
            case "speedup":
                return f"{value:.3f}x"
        size = f"{value / 1e6:.2f} MB" if abs(value) >= 1e6 else f"{value / 1e3:.2f} kB"  # 1KB is not "0.00 MB"
        return f"{size} at {self.context} tokens"

    def to_record(self) -> dict[str, Any]:
        return asdict(self)
