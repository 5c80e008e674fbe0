"""The contract between the pruning algorithm and one model family.

The algorithm never names a Hugging Face module: it asks a `ModelAdapter` for decoder layers,
output projections and unit counts, and tells it which units to keep. To add a family, subclass
`ModelAdapter` in a module of this package, implement the abstract methods, and register the
class for the `config.architectures[0]` names it handles with `@ADAPTERS.register_architecture`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn
from transformers import PreTrainedModel

from gapprune.models.pages import release_file_pages


@dataclass(frozen=True)
class LayerShape:
    """Unit counts of one decoder layer; 0 means the sub-block is removed."""

    n_heads: int
    n_kv_heads: int
    intermediate: int

    def to_config(self) -> dict[str, int]:
        return {
            "num_attention_heads": self.n_heads,
            "num_key_value_heads": self.n_kv_heads,
            "intermediate_size": self.intermediate,
        }


@dataclass(frozen=True)
class Projections:
    """A component's linear projections by the role their rows/columns play for its units.

    unit_rows: outputs are per unit (q_proj per query head; gate/up per channel);
    group_rows: outputs are per KV group, shared by its query heads (k_proj, v_proj; none for the MLP);
    out: the output projection, whose input columns are the units (o_proj, down_proj).
    """

    unit_rows: tuple[nn.Linear, ...]
    group_rows: tuple[nn.Linear, ...]
    out: nn.Linear

    def all(self) -> list[nn.Linear]:
        return [*self.unit_rows, *self.group_rows, self.out]


class ModelAdapter(ABC):
    """Family-specific access to a decoder-only causal LM, for pruning."""

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self.config = model.config

    # -- structure -------------------------------------------------------------------------
    @property
    @abstractmethod
    def layers(self) -> nn.ModuleList: ...

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def hidden(self) -> int:
        return int(self.config.hidden_size)

    @property
    def head_dim(self) -> int:
        return int(getattr(self.config, "head_dim", None) or self.hidden // self.config.num_attention_heads)

    def unit_width(self, component: str) -> int:
        """Input columns of the output projection that one unit owns: a query head's head_dim, or one channel."""
        return self.head_dim if component == "attn" else 1

    @abstractmethod
    def layer_shape(self, layer: int) -> LayerShape:
        """Current unit counts of `layer`, read from its modules (not from the config)."""

    @abstractmethod
    def out_proj(self, layer: int, component: str) -> nn.Linear | None:
        """The output projection of a component (o_proj / down_proj), None when removed."""

    @abstractmethod
    def stat_points(self, layer: int) -> dict[str, nn.Linear]:
        """Linear modules whose inputs calibration statistics are taken on, by role name:
        `attn_in` (q_proj), `attn_out` (o_proj), `mlp_in` (gate_proj), `mlp_out` (down_proj)."""

    @abstractmethod
    def projections(self, layer: int, component: str) -> Projections | None:
        """The component's projections by role (None when the sub-block is removed)."""

    def component_weights(self, layer: int, component: str) -> list[nn.Linear]:
        """All Linear modules of a component (for magnitude, Taylor and parameter counts)."""
        found = self.projections(layer, component)
        return [] if found is None else found.all()

    @property
    @abstractmethod
    def projection_names(self) -> tuple[str, ...]:
        """Module names of the decoder's linear projections (LoRA targets), e.g. `q_proj`, ..., `down_proj`."""

    @abstractmethod
    def final_norm(self) -> nn.Module: ...

    @abstractmethod
    def lm_head(self) -> nn.Linear: ...

    # -- surgery ---------------------------------------------------------------------------
    @abstractmethod
    def prune_attention_(self, layer: int, kept_heads: Sequence[int]) -> None:
        """Keep only the query heads `kept_heads` (sorted ids of the layer's current heads).

        Every kept KV group must keep the same number of query heads; KV groups with no kept
        head go. An empty list removes the attention sub-block.
        """

    @abstractmethod
    def prune_mlp_(self, layer: int, kept_channels: Sequence[int]) -> None:
        """Keep only the intermediate channels `kept_channels`; empty removes the MLP."""

    # -- derived ---------------------------------------------------------------------------
    def shapes(self) -> list[LayerShape]:
        return [self.layer_shape(i) for i in range(self.n_layers)]

    def record_shapes_(self) -> None:
        """Write every layer's shape to the config in one assignment (never per layer).

        Besides unit counts, each entry says whether o_proj / down_proj carry a bias (compensation
        can add one), so the folder reloads with exactly these modules.
        """
        shapes = []
        for layer, shape in enumerate(self.shapes()):
            entry: dict[str, int | bool] = dict(shape.to_config())
            for component, key in (("attn", "attn_out_bias"), ("mlp", "mlp_out_bias")):
                out = self.out_proj(layer, component)
                entry[key] = bool(out is not None and out.bias is not None)
            shapes.append(entry)
        self.config.layer_shapes = shapes

    @abstractmethod
    def attn_option_params(self, layer: int, n_kv_heads: int, heads_per_group: int) -> int:
        """Exact parameters the attention component of `layer` holds with g groups of q heads
        (its norms included; 0 when g == 0, since the whole sub-block then goes)."""

    @abstractmethod
    def mlp_option_params(self, layer: int, intermediate: int) -> int:
        """Exact parameters the MLP component holds with `intermediate` channels (norm included)."""

    def decoder_params(self) -> int:
        """Parameters of the decoder layers: what `--ratio-of decoder` takes its fraction of."""
        return sum(p.numel() for p in self.layers.parameters())

    def component_params(self, layer: int, component: str) -> int:
        """Exact parameters currently held by one component (its linears, biases, its norm)."""
        return sum(p.numel() for p in self.component_module_params(layer, component))

    @abstractmethod
    def component_module_params(self, layer: int, component: str) -> list[nn.Parameter]: ...


def slice_linear(linear: nn.Linear, rows: torch.Tensor | None = None, cols: torch.Tensor | None = None) -> nn.Linear:
    """A new Linear holding `linear`'s weight rows (outputs) and columns (inputs) at sorted ids, to
    replace it: the old weight's memory-mapped pages are handed back (`pages.py`)."""
    weight = linear.weight.data  # (out, in)
    bias = linear.bias.data if linear.bias is not None else None
    if rows is not None:
        rows = rows.to(weight.device)
        weight = weight.index_select(0, rows)
        bias = bias.index_select(0, rows) if bias is not None else None
    if cols is not None:
        weight = weight.index_select(1, cols.to(weight.device))
    if rows is None and cols is None:
        weight = weight.clone()
    out_features, in_features = weight.shape
    new = nn.Linear(in_features, out_features, bias=bias is not None, device="meta")  # no init, no second copy
    new.weight = nn.Parameter(weight, requires_grad=linear.weight.requires_grad)
    if bias is not None:
        new.bias = nn.Parameter(bias.clone() if rows is None else bias, requires_grad=linear.bias.requires_grad)
    release_file_pages(p.data for p in linear.parameters())
    return new


class AdapterRegistry:
    """Adapters keyed by `config.architectures[0]`; unknown names get a clear error."""

    def __init__(self) -> None:
        self._by_architecture: dict[str, type[ModelAdapter]] = {}

    def register_architecture(self, *names: str) -> Callable[[type[ModelAdapter]], type[ModelAdapter]]:
        def decorator(cls: type[ModelAdapter]) -> type[ModelAdapter]:
            for name in names:
                if name in self._by_architecture:
                    raise ValueError(f"architecture {name!r} already has an adapter")
                self._by_architecture[name] = cls
            return cls

        return decorator

    def supported(self) -> list[str]:
        return sorted(self._by_architecture)

    def adapter_class(self, config: Any, fallback: str = "") -> type[ModelAdapter]:
        """The adapter class for a model config (`architectures[0]`); a clear error for any other family."""
        arch = (getattr(config, "architectures", None) or [fallback])[0]
        cls = self._by_architecture.get(arch.removeprefix("Gappruned"))
        if cls is None:
            raise ValueError(
                f"unsupported architecture {arch!r}: gapprune supports {', '.join(self.supported())}. "
                "Add an adapter in gapprune/models/ to support another family."
            )
        return cls

    def for_model(self, model: nn.Module) -> ModelAdapter:
        """The adapter for a transformers causal LM (the pipeline passes models as plain modules)."""
        hf_model = cast(PreTrainedModel, model)
        return self.adapter_class(hf_model.config, type(model).__name__)(hf_model)


ADAPTERS = AdapterRegistry()
