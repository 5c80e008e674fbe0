"""Modeling code for gapprune's pruned Llama-family and Gemma 3 models; imports only torch and transformers.

This file is copied next to the weights of every saved model and registered through `auto_map`,
so `AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)` works where gapprune is
not installed. It never copies Hugging Face modeling code: each class *subclasses* the family's
`...ForCausalLM` and, after `super().__init__`, resizes every decoder layer to the per-layer shapes
stored in `config.layer_shapes` (a list of dicts, one per layer):

    {"num_attention_heads": int, "num_key_value_heads": int, "intermediate_size": int}

A count of 0 means the sub-block was removed: the residual stream passes through untouched, so
the norms that belong to the sub-block go with it (`SUB_BLOCK_NORMS`: Llama has one pre-norm per
sub-block, Gemma 3 a pre- and a post-norm around each).
Optional `attn_out_bias` / `mlp_out_bias` say that o_proj / down_proj carry a bias (added by
training-free compensation).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, cast

import torch
from torch import nn
from transformers import (
    Gemma3ForCausalLM,
    LlamaForCausalLM,
    MistralForCausalLM,
    PreTrainedModel,
    Qwen2ForCausalLM,
    Qwen3ForCausalLM,
)


class AttentionModules(Protocol):
    """What resizing reads and writes on a Llama-style attention sub-block.

    torch types every submodule as `Tensor | Module`; this names what transformers' attention
    classes of these families actually hold, so the surgery is checked against it.
    """

    q_proj: nn.Linear
    k_proj: nn.Linear
    v_proj: nn.Linear
    o_proj: nn.Linear
    layer_idx: int
    num_key_value_groups: int

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...


class GatedMLPModules(Protocol):
    """What resizing reads and writes on a gated MLP sub-block (SwiGLU / GeGLU)."""

    gate_proj: nn.Linear
    up_proj: nn.Linear
    down_proj: nn.Linear

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...


def attention_of(layer: nn.Module) -> AttentionModules:
    """The layer's attention sub-block (callers check for `RemovedAttention` first)."""
    return cast(AttentionModules, layer.self_attn)


def mlp_of(layer: nn.Module) -> GatedMLPModules:
    """The layer's MLP sub-block (callers check for `RemovedMLP` first)."""
    return cast(GatedMLPModules, layer.mlp)


class RemovedAttention(nn.Module):
    """Stands in for a removed attention sub-block: adds nothing to the residual stream.

    It still writes a one-element-wide entry into the KV cache so that the cache reports the right
    sequence length (transformers reads it from any layer, often layer 0).
    """

    def __init__(self, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if cache is not None:
            batch, seq = hidden_states.shape[:2]
            stub = hidden_states.new_zeros(batch, 1, seq, 1)  # (B, 1 head, T, 1): length bookkeeping only
            cache.update(stub, stub, self.layer_idx)
        return torch.zeros_like(hidden_states), None


class RemovedMLP(nn.Module):
    """Stands in for a removed MLP sub-block: adds nothing to the residual stream."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(hidden_states)


SubBlockNorms = dict[str, tuple[str, ...]]

LLAMA_NORMS: SubBlockNorms = {"attn": ("input_layernorm",), "mlp": ("post_attention_layernorm",)}
"""Llama-style layers: one RMSNorm before each sub-block (`post_attention_layernorm` is the MLP's)."""

GEMMA3_NORMS: SubBlockNorms = {
    "attn": ("input_layernorm", "post_attention_layernorm"),
    "mlp": ("pre_feedforward_layernorm", "post_feedforward_layernorm"),
}
"""Gemma 3 layers: x + post_norm(block(pre_norm(x))) for each sub-block, so both norms are the block's."""


def remove_sub_block_(layer: nn.Module, component: str, norms: SubBlockNorms) -> None:
    """Replace a sub-block by a zero-output stand-in and its norms by identities.

    The stand-in outputs zeros and every RMSNorm maps zeros to zeros, so the identities keep the
    residual stream exactly as skipping the sub-block would, with none of its parameters left.
    """
    if component == "attn":
        layer.self_attn = RemovedAttention(attention_of(layer).layer_idx)
    else:
        layer.mlp = RemovedMLP()
    for name in norms[component]:
        setattr(layer, name, nn.Identity())


def _resized_linear(linear: nn.Linear, in_features: int, out_features: int, bias: bool | None = None) -> nn.Linear:
    has_bias = linear.bias is not None if bias is None else bias
    return nn.Linear(in_features, out_features, bias=has_bias, device=linear.weight.device, dtype=linear.weight.dtype)


def resize_decoder_layer_(
    layer: nn.Module, shape: dict[str, Any], head_dim: int, norms: SubBlockNorms = LLAMA_NORMS
) -> None:
    """Give one decoder layer the shapes in `shape` (weights uninitialised; loading fills them)."""
    n_heads, n_kv, inter = shape["num_attention_heads"], shape["num_key_value_heads"], shape["intermediate_size"]
    if n_heads == 0:
        remove_sub_block_(layer, "attn", norms)
    else:
        attn = attention_of(layer)
        hidden = attn.q_proj.in_features
        attn.q_proj = _resized_linear(attn.q_proj, hidden, n_heads * head_dim)
        attn.k_proj = _resized_linear(attn.k_proj, hidden, n_kv * head_dim)
        attn.v_proj = _resized_linear(attn.v_proj, hidden, n_kv * head_dim)
        attn.o_proj = _resized_linear(attn.o_proj, n_heads * head_dim, hidden, shape.get("attn_out_bias"))
        attn.num_key_value_groups = n_heads // n_kv
    if inter == 0:
        remove_sub_block_(layer, "mlp", norms)
    else:
        mlp = mlp_of(layer)
        hidden = mlp.gate_proj.in_features
        mlp.gate_proj = _resized_linear(mlp.gate_proj, hidden, inter)
        mlp.up_proj = _resized_linear(mlp.up_proj, hidden, inter)
        mlp.down_proj = _resized_linear(mlp.down_proj, inter, hidden, shape.get("mlp_out_bias"))
        if hasattr(mlp, "intermediate_size"):
            mlp.intermediate_size = inter


def resize_model_layers_(model: PreTrainedModel, norms: SubBlockNorms = LLAMA_NORMS) -> None:
    """Resize every decoder layer of `model` to `model.config.layer_shapes` (no-op when absent)."""
    config = model.config
    shapes = getattr(config, "layer_shapes", None)
    if not shapes:
        return
    layers = model.model.layers
    if len(shapes) != len(layers):
        raise ValueError(f"config.layer_shapes has {len(shapes)} entries but the model has {len(layers)} layers")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    for layer, shape in zip(layers, shapes):
        resize_decoder_layer_(layer, shape, head_dim, norms)


class _LayerShapesMixin:
    """After the family's own __init__, resize the layers to the recorded per-layer shapes."""

    sub_block_norms: SubBlockNorms = LLAMA_NORMS

    def _resize_after_init(self) -> None:
        resize_model_layers_(self, self.sub_block_norms)  # type: ignore[arg-type]


class GapprunedLlamaForCausalLM(LlamaForCausalLM, _LayerShapesMixin):
    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._resize_after_init()


class GapprunedMistralForCausalLM(MistralForCausalLM, _LayerShapesMixin):
    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._resize_after_init()


class GapprunedQwen2ForCausalLM(Qwen2ForCausalLM, _LayerShapesMixin):
    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._resize_after_init()


class GapprunedQwen3ForCausalLM(Qwen3ForCausalLM, _LayerShapesMixin):
    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._resize_after_init()


class GapprunedGemma3ForCausalLM(Gemma3ForCausalLM, _LayerShapesMixin):
    sub_block_norms = GEMMA3_NORMS

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self._resize_after_init()


PRUNED_CLASS_FOR_ARCHITECTURE = {
    "Gemma3ForCausalLM": GapprunedGemma3ForCausalLM,
    "LlamaForCausalLM": GapprunedLlamaForCausalLM,
    "MistralForCausalLM": GapprunedMistralForCausalLM,
    "Qwen2ForCausalLM": GapprunedQwen2ForCausalLM,
    "Qwen3ForCausalLM": GapprunedQwen3ForCausalLM,
}
