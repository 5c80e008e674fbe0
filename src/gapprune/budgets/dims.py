"""`ModelDims`: the dense model's shapes as the runtime cost models read them (below every cost model)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelDims:
    """The dense model's shapes, as the cost models need them."""

    n_layers: int
    hidden: int
    head_dim: int
    n_heads: int
    n_kv_heads: int
    intermediate: int
    vocab: int
    tied: bool

    @classmethod
    def from_config(cls, config: Any) -> ModelDims:
        hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
        return cls(int(config.num_hidden_layers), hidden, int(getattr(config, "head_dim", None) or hidden // heads),
                   heads, int(config.num_key_value_heads), int(config.intermediate_size), int(config.vocab_size),
                   bool(getattr(config, "tie_word_embeddings", False)))
