"""vLLM model classes for gapprune's pruned folders: every decoder layer built at its own shape.

vLLM builds each layer of a dense family from one global config, so a folder whose layers keep different
numbers of query heads, KV heads and MLP channels fails to load. These classes keep vLLM's own model
shells (embedding, final norm, head, weight loading, torch.compile) and vLLM's own attention and MLP
blocks, and give each decoder layer a copy of the config with that layer's counts from
`config.layer_shapes` (the same list `modeling_gapprune.py` reads for transformers):

    {"num_attention_heads": int, "num_key_value_heads": int, "intermediate_size": int,
     "attn_out_bias": bool?, "mlp_out_bias": bool?}

A count of 0 means the sub-block was removed: no module, no norm, no KV cache, and the residual stream
passes through. `attn_out_bias` / `mlp_out_bias` give o_proj / down_proj the bias training-free
compensation adds. vLLM's v1 KV-cache manager already keeps layers of one attention type with different
KV shapes (as for Nemotron-NAS), so nothing in vLLM changes.

This module imports vLLM and runs only inside a vLLM process; `vllm_plugin.register` names it lazily.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.model_executor.layers.layernorm import GemmaRMSNorm, RMSNorm
from vllm.model_executor.layers.linear import RowParallelLinear
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from vllm.model_executor.models.gemma3 import Gemma3Attention, Gemma3ForCausalLM, Gemma3MLP, Gemma3Model
from vllm.model_executor.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP
from vllm.model_executor.models.qwen3 import Qwen3Attention
from vllm.model_executor.models.utils import (
    extract_layer_index,
    make_empty_intermediate_tensors_factory,
    make_layers,
    maybe_prefix,
)
from vllm.transformers_utils.config import set_default_rope_theta

LAYER_COUNTS = ("num_attention_heads", "num_key_value_heads", "intermediate_size")


def layer_config(config: Any, layer: int) -> Any:
    """A copy of the model's config with one layer's counts (never written back: the Torch-Pruning trap)."""
    shapes = getattr(config, "layer_shapes", None)
    if not shapes:
        raise ValueError(
            "config.json has no layer_shapes: this folder is not a gapprune pruned model; serve it with "
            "the family's own architecture name"
        )
    if len(shapes) != config.num_hidden_layers:
        raise ValueError(f"layer_shapes has {len(shapes)} entries but the model has {config.num_hidden_layers} layers")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    own = copy.copy(config)
    for name in LAYER_COUNTS:
        setattr(own, name, int(shapes[layer][name]))
    own.head_dim = head_dim  # the dense head size: hidden // heads would be wrong once heads are removed
    own.attn_out_bias = bool(shapes[layer].get("attn_out_bias", False))
    own.mlp_out_bias = bool(shapes[layer].get("mlp_out_bias", False))
    return own


def with_biased_output_(block: nn.Module, name: str, prefix: str, quant_config: Any) -> None:
    """Give `block.<name>` (a RowParallelLinear without bias) a bias, keeping its sizes and sharding."""
    old = getattr(block, name)
    if old.bias is not None:
        return
    setattr(block, name, RowParallelLinear(
        old.input_size, old.output_size, bias=True, quant_config=quant_config, prefix=f"{prefix}.{name}",
    ))


@dataclass(frozen=True)
class Family:
    """How one family builds a layer's attention and MLP, and which norms surround them."""

    attention: Callable[[Any, VllmConfig, str], nn.Module]  # (layer config, vllm config, prefix)
    mlp: Callable[[Any, VllmConfig, str], nn.Module]
    norm: type[nn.Module]
    attn_norms: tuple[str, ...]  # the first takes the pending residual add; any second normalises the output
    mlp_norms: tuple[str, ...]


def _llama_attention(qkv_bias: bool | None) -> Callable[[Any, VllmConfig, str], nn.Module]:
    def build(cfg: Any, vllm_config: VllmConfig, prefix: str) -> nn.Module:
        dense_bias = bool(getattr(cfg, "attention_bias", False))
        return LlamaAttention(
            config=cfg, hidden_size=cfg.hidden_size, num_heads=cfg.num_attention_heads,
            num_kv_heads=cfg.num_key_value_heads,
            max_position_embeddings=getattr(cfg, "max_position_embeddings", 8192),
            quant_config=vllm_config.quant_config, bias=dense_bias if qkv_bias is None else qkv_bias,
            bias_o_proj=dense_bias or cfg.attn_out_bias, cache_config=vllm_config.cache_config, prefix=prefix,
        )
    return build


def _qwen3_attention(cfg: Any, vllm_config: VllmConfig, prefix: str) -> nn.Module:
    set_default_rope_theta(cfg, default_theta=1000000)
    attention = Qwen3Attention(
        hidden_size=cfg.hidden_size, num_heads=cfg.num_attention_heads, num_kv_heads=cfg.num_key_value_heads,
        rope_parameters=cfg.rope_parameters, max_position=cfg.max_position_embeddings, head_dim=cfg.head_dim,
        rms_norm_eps=cfg.rms_norm_eps, qkv_bias=getattr(cfg, "attention_bias", False),
        cache_config=vllm_config.cache_config, quant_config=vllm_config.quant_config, prefix=prefix,
    )
    if cfg.attn_out_bias:
        with_biased_output_(attention, "o_proj", prefix, vllm_config.quant_config)
    return attention


def _gemma3_attention(cfg: Any, vllm_config: VllmConfig, prefix: str) -> nn.Module:
    attention = Gemma3Attention(
        config=cfg, hidden_size=cfg.hidden_size, num_heads=cfg.num_attention_heads,
        num_kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings, cache_config=vllm_config.cache_config,
        quant_config=vllm_config.quant_config, attn_logits_soft_cap=None, prefix=prefix,
    )
    if cfg.attn_out_bias:
        with_biased_output_(attention, "o_proj", prefix, vllm_config.quant_config)
    return attention


def _llama_mlp(cfg: Any, vllm_config: VllmConfig, prefix: str) -> nn.Module:
    mlp = LlamaMLP(
        hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size, hidden_act=cfg.hidden_act,
        quant_config=vllm_config.quant_config, bias=getattr(cfg, "mlp_bias", False), prefix=prefix,
    )
    if cfg.mlp_out_bias:
        with_biased_output_(mlp, "down_proj", prefix, vllm_config.quant_config)
    return mlp


def _gemma3_mlp(cfg: Any, vllm_config: VllmConfig, prefix: str) -> nn.Module:
    mlp = Gemma3MLP(
        hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        hidden_activation=cfg.hidden_activation, quant_config=vllm_config.quant_config, prefix=prefix,
    )
    if cfg.mlp_out_bias:
        with_biased_output_(mlp, "down_proj", prefix, vllm_config.quant_config)
    return mlp


LLAMA_NORMS = {"attn_norms": ("input_layernorm",), "mlp_norms": ("post_attention_layernorm",)}
FAMILIES = {
    "llama": Family(_llama_attention(None), _llama_mlp, RMSNorm, **LLAMA_NORMS),
    "qwen2": Family(_llama_attention(True), _llama_mlp, RMSNorm, **LLAMA_NORMS),  # Llama with q/k/v biases
    "qwen3": Family(_qwen3_attention, _llama_mlp, RMSNorm, **LLAMA_NORMS),
    "gemma3": Family(
        _gemma3_attention, _gemma3_mlp, GemmaRMSNorm,
        attn_norms=("input_layernorm", "post_attention_layernorm"),
        mlp_norms=("pre_feedforward_layernorm", "post_feedforward_layernorm"),
    ),
}


class PrunedDecoderLayer(nn.Module):
    """One decoder layer at its own shape; a removed sub-block has no module and no norm.

    vLLM's layers pass the residual stream as a pending sum (hidden_states + residual) that the next
    norm adds in its fused kernel; skipping a sub-block leaves that sum pending for the next one.
    """

    def __init__(self, family: Family, vllm_config: VllmConfig, prefix: str) -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config.get_text_config()
        cfg = layer_config(config, extract_layer_index(prefix))
        self.has_attn = cfg.num_attention_heads > 0
        self.has_mlp = cfg.intermediate_size > 0
        self.attn_norm_names = family.attn_norms
        self.mlp_norm_names = family.mlp_norms
        if self.has_attn:
            self.self_attn = family.attention(cfg, vllm_config, f"{prefix}.self_attn")
            for name in family.attn_norms:
                setattr(self, name, family.norm(cfg.hidden_size, eps=cfg.rms_norm_eps))
        if self.has_mlp:
            self.mlp = family.mlp(cfg, vllm_config, f"{prefix}.mlp")
            for name in family.mlp_norms:
                setattr(self, name, family.norm(cfg.hidden_size, eps=cfg.rms_norm_eps))

    def _sub_block(
        self, block: Callable[[torch.Tensor], torch.Tensor], norms: tuple[str, ...],
        hidden_states: torch.Tensor, residual: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        pre = getattr(self, norms[0])
        if residual is None:
            residual = hidden_states
            hidden_states = pre(hidden_states)
        else:
            hidden_states, residual = pre(hidden_states, residual)
        hidden_states = block(hidden_states)
        for name in norms[1:]:
            hidden_states = getattr(self, name)(hidden_states)
        return hidden_states, residual

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.has_attn:
            hidden_states, residual = self._sub_block(
                lambda x: self.self_attn(positions=positions, hidden_states=x),
                self.attn_norm_names, hidden_states, residual,
            )
        if self.has_mlp:
            hidden_states, residual = self._sub_block(self.mlp, self.mlp_norm_names, hidden_states, residual)
        return hidden_states, residual


def layer_type_for(family: str) -> type[nn.Module]:
    """A layer class with vLLM's `layer_type(vllm_config=..., prefix=...)` signature for `family`."""
    spec = FAMILIES[family]

    class _Layer(PrunedDecoderLayer):
        def __init__(self, vllm_config: VllmConfig, prefix: str = "", **_: Any) -> None:
            super().__init__(spec, vllm_config, prefix)

    _Layer.__name__ = _Layer.__qualname__ = f"Pruned{family.title()}DecoderLayer"
    return _Layer


class _PrunedLlamaShell(LlamaForCausalLM):
    """vLLM's Llama model around per-layer decoder layers: Llama, Mistral, Qwen2 and Qwen3 share it."""

    family = "llama"

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "", **_: Any) -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, layer_type=layer_type_for(self.family))


class GapprunedLlamaForCausalLM(_PrunedLlamaShell):
    family = "llama"


class GapprunedMistralForCausalLM(_PrunedLlamaShell):
    family = "llama"


class GapprunedQwen2ForCausalLM(_PrunedLlamaShell):
    family = "qwen2"


class GapprunedQwen3ForCausalLM(_PrunedLlamaShell):
    family = "qwen3"


@support_torch_compile
class GapprunedGemma3Model(Gemma3Model):
    """vLLM's Gemma 3 text model with per-layer decoder layers (its own __init__ names its layer class)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        nn.Module.__init__(self)
        config = vllm_config.model_config.hf_config
        self.config = config
        self.quant_config = vllm_config.quant_config
        self.embed_tokens = VocabParallelEmbedding(
            config.vocab_size, config.hidden_size, quant_config=self.quant_config, prefix=f"{prefix}.embed_tokens",
        )
        layer = layer_type_for("gemma3")
        self.start_layer, self.end_layer, self.layers = make_layers(
            config.num_hidden_layers, lambda prefix: layer(vllm_config=vllm_config, prefix=prefix),
            prefix=f"{prefix}.layers",
        )
        self.norm = GemmaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.register_buffer("normalizer", torch.tensor(config.hidden_size**0.5), persistent=False)
        self.make_empty_intermediate_tensors = make_empty_intermediate_tensors_factory(
            ["hidden_states", "residual"], config.hidden_size
        )


class GapprunedGemma3ForCausalLM(Gemma3ForCausalLM):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        nn.Module.__init__(self)
        config = vllm_config.model_config.hf_config
        self.config = config
        self.quant_config = vllm_config.quant_config
        self.model = GapprunedGemma3Model(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        self.lm_head = ParallelLMHead(
            config.vocab_size, config.hidden_size, quant_config=self.quant_config,
            prefix=maybe_prefix(prefix, "lm_head"),
        )
        if config.tie_word_embeddings:
            self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(config.vocab_size, soft_cap=config.final_logit_softcapping)
        self.make_empty_intermediate_tensors = self.model.make_empty_intermediate_tensors
