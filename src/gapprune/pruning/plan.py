"""A pruning plan: for every layer and component, the sorted ids of the units kept (JSON round-trip)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gapprune.components import COMPONENTS
from gapprune.importance.base import UnitScores
from gapprune.models.adapter import ModelAdapter
from gapprune.options import kept_units, option_params


@dataclass
class ComponentPlan:
    """What one component keeps. For attention `kept` are query-head ids; `option` is [g, q]
    (attention) or [channels] (mlp); `rate` is the fraction of the component's parameters removed."""

    kept: list[int]
    option: list[int]
    rate: float
    params_before: int
    params_after: int
    loss: float | None = None


@dataclass
class LayerPlan:
    layer: int
    attn: ComponentPlan
    mlp: ComponentPlan

    def component(self, name: str) -> ComponentPlan:
        return self.attn if name == "attn" else self.mlp


@dataclass
class Plan:
    """Per-layer kept units plus the resolved configuration and summary numbers."""

    layers: list[LayerPlan]
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config, "summary": self.summary, "layers": [asdict(lp) for lp in self.layers]}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        """Raises TypeError or KeyError naming the first part that is not what plan.json writes (a
        hand-edited plan: `"option": 96` for `[96]`, `"config": null`), before any of it is used."""
        if not isinstance(data, dict) or not isinstance(data.get("layers"), list):
            raise TypeError("it must be an object with a list of layers")
        for part in ("config", "summary"):
            if not isinstance(data.get(part, {}), dict):
                raise TypeError(f'"{part}" must be an object, not {type(data[part]).__name__}')
        layers = [
            LayerPlan(layer=lp["layer"], attn=_component(lp, "attn"), mlp=_component(lp, "mlp"))
            for lp in data["layers"]
        ]
        return cls(layers=layers, config=data.get("config", {}), summary=data.get("summary", {}))

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        if not Path(path).is_file():
            raise FileNotFoundError(f"plan {path} does not exist; pass the plan.json an earlier prune wrote (DIR/plan.json)")
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (KeyError, TypeError, json.JSONDecodeError) as err:
            raise ValueError(f"{path} is not a valid plan.json: {err}") from None

    @property
    def params_removed(self) -> int:
        return sum(c.params_before - c.params_after for lp in self.layers for c in (lp.attn, lp.mlp))


def _component(layer: dict[str, Any], name: str) -> ComponentPlan:
    plan = ComponentPlan(**layer[name])
    for key in ("kept", "option"):
        value = getattr(plan, key)
        if not isinstance(value, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
            raise TypeError(f'layer {layer.get("layer")} {name}: "{key}" must be a list of integers, got {value!r}')
    return plan


def make_plan(
    adapter: ModelAdapter,
    scores: UnitScores,
    options: list[dict[str, list[int]]],
    losses: list[dict[str, float]] | None = None,
    config: dict[str, Any] | None = None,
) -> Plan:
    """Turn one chosen option per (layer, component) into a plan of kept unit ids."""
    layers = []
    for layer, per in enumerate(options):
        comps = {}
        for component in COMPONENTS:
            option = list(per[component])
            before = adapter.component_params(layer, component)
            after = option_params(adapter, layer, component, option)
            comps[component] = ComponentPlan(
                kept=kept_units(scores, adapter, layer, component, option),
                option=option,
                rate=round(1 - after / before, 6) if before else 0.0,
                params_before=before,
                params_after=after,
                loss=None if losses is None else float(losses[layer][component]),
            )
        layers.append(LayerPlan(layer=layer, attn=comps["attn"], mlp=comps["mlp"]))
    return Plan(layers=layers, config=dict(config or {}))
