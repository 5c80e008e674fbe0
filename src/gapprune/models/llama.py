"""Llama-style decoders: Llama 1/2/3, Mistral, Qwen2 (q/k/v biases), Qwen3 (q/k norms), SmolLM.

They share module names (`model.layers[i].self_attn.{q,k,v,o}_proj`, `mlp.{gate,up,down}_proj`,
`input_layernorm`, `post_attention_layernorm`), so one adapter serves them all. Query head h reads
KV head h // n_rep, which is what lets a KV group be removed together with its query heads.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from gapprune.models.adapter import ADAPTERS, LayerShape, ModelAdapter, Projections, slice_linear
from gapprune.models.modeling_gapprune import (
    LLAMA_NORMS,
    AttentionModules,
    GatedMLPModules,
    RemovedAttention,
    RemovedMLP,
    SubBlockNorms,
    attention_of,
    mlp_of,
    remove_sub_block_,
)
from gapprune.models.pages import release_file_pages


@ADAPTERS.register_architecture("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
class LlamaFamilyAdapter(ModelAdapter):
    projection_names = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    sub_block_norms: SubBlockNorms = LLAMA_NORMS  # the norms that go with a removed sub-block

    @property
    def layers(self) -> nn.ModuleList:
        return self.model.model.layers

    def final_norm(self) -> nn.Module:
        return self.model.model.norm

    def lm_head(self) -> nn.Linear:
        return self.model.lm_head

    def _attn(self, layer: int) -> AttentionModules | None:
        block = self.layers[layer]
        return None if isinstance(block.self_attn, RemovedAttention) else attention_of(block)

    def _mlp(self, layer: int) -> GatedMLPModules | None:
        block = self.layers[layer]
        return None if isinstance(block.mlp, RemovedMLP) else mlp_of(block)

    def layer_shape(self, layer: int) -> LayerShape:
        attn, mlp = self._attn(layer), self._mlp(layer)
        n_heads = attn.q_proj.out_features // self.head_dim if attn is not None else 0
        n_kv = attn.k_proj.out_features // self.head_dim if attn is not None else 0
        inter = mlp.down_proj.in_features if mlp is not None else 0
        return LayerShape(n_heads, n_kv, inter)

    def out_proj(self, layer: int, component: str) -> nn.Linear | None:
        match component:
            case "attn":
                attn = self._attn(layer)
                return attn.o_proj if attn is not None else None
            case "mlp":
                mlp = self._mlp(layer)
                return mlp.down_proj if mlp is not None else None
        raise ValueError(f"unknown component {component!r}")

    def stat_points(self, layer: int) -> dict[str, nn.Linear]:
        points: dict[str, nn.Linear] = {}
        if (attn := self._attn(layer)) is not None:
            points["attn_in"], points["attn_out"] = attn.q_proj, attn.o_proj
        if (mlp := self._mlp(layer)) is not None:
            points["mlp_in"], points["mlp_out"] = mlp.gate_proj, mlp.down_proj
        return points

    def projections(self, layer: int, component: str) -> Projections | None:
        if component == "attn":
            attn = self._attn(layer)
            return None if attn is None else Projections((attn.q_proj,), (attn.k_proj, attn.v_proj), attn.o_proj)
        mlp = self._mlp(layer)
        return None if mlp is None else Projections((mlp.gate_proj, mlp.up_proj), (), mlp.down_proj)

    def component_module_params(self, layer: int, component: str) -> list[nn.Parameter]:
        block = self.layers[layer]
        names = ("self_attn" if component == "attn" else "mlp", *self.sub_block_norms[component])
        modules: list[nn.Module] = [getattr(block, name) for name in names]
        return [p for m in modules for p in m.parameters()]

    # -- analytic parameter counts (checked against real modules by the contract test) -------
    def attn_option_params(self, layer: int, n_kv_heads: int, heads_per_group: int) -> int:
        if n_kv_heads == 0 or heads_per_group == 0:
            return 0
        hd, hidden = self.head_dim, self.hidden
        n_heads = n_kv_heads * heads_per_group
        total = (2 * n_heads + 2 * n_kv_heads) * hd * hidden + hidden  # q,k,v,o + input_layernorm
        if getattr(self.config, "attention_bias", False) or self.config.model_type == "qwen2":
            total += (n_heads + 2 * n_kv_heads) * hd  # q, k, v biases
            if getattr(self.config, "attention_bias", False) and self.config.model_type != "qwen2":
                total += hidden  # o_proj bias (Llama with attention_bias=True)
        if self.config.model_type == "qwen3":
            total += 2 * hd  # q_norm, k_norm
        return total

    def mlp_option_params(self, layer: int, intermediate: int) -> int:
        if intermediate == 0:
            return 0
        bias = 2 * intermediate + self.hidden if getattr(self.config, "mlp_bias", False) else 0
        return 3 * intermediate * self.hidden + self.hidden + bias  # gate, up, down + post_attention_layernorm

    # -- surgery ---------------------------------------------------------------------------
    def prune_attention_(self, layer: int, kept_heads: Sequence[int]) -> None:
        attn = self._attn(layer)
        if attn is None:
            if kept_heads:
                raise ValueError(f"layer {layer}: attention is already removed, cannot keep heads {list(kept_heads)}")
            return
        if not kept_heads:
            release_file_pages(p.data for p in attn.parameters())
            remove_sub_block_(self.layers[layer], "attn", self.sub_block_norms)
            return
        shape = self.layer_shape(layer)
        n_rep = shape.n_heads // shape.n_kv_heads
        heads = sorted({int(h) for h in kept_heads})
        if heads[0] < 0 or heads[-1] >= shape.n_heads:
            raise ValueError(f"layer {layer}: head ids must lie in [0, {shape.n_heads}), got {heads}")
        groups = sorted({h // n_rep for h in heads})
        per_group = [sum(1 for h in heads if h // n_rep == g) for g in groups]
        if len(set(per_group)) != 1:
            raise ValueError(
                f"layer {layer}: every kept KV group must keep the same number of query heads, got {per_group}"
            )
        hd = self.head_dim
        device = attn.q_proj.weight.device
        q_rows = torch.tensor([h * hd + d for h in heads for d in range(hd)], device=device)
        kv_rows = torch.tensor([g * hd + d for g in groups for d in range(hd)], device=device)
        attn.q_proj = slice_linear(attn.q_proj, rows=q_rows)  # (len(heads)*hd, hidden)
        attn.k_proj = slice_linear(attn.k_proj, rows=kv_rows)  # (len(groups)*hd, hidden)
        attn.v_proj = slice_linear(attn.v_proj, rows=kv_rows)
        attn.o_proj = slice_linear(attn.o_proj, cols=q_rows)  # (hidden, len(heads)*hd)
        attn.num_key_value_groups = per_group[0]
        for name, count in (("num_heads", len(heads)), ("num_attention_heads", len(heads)),
                            ("num_key_value_heads", len(groups))):
            if hasattr(attn, name):
                setattr(attn, name, count)

    def prune_mlp_(self, layer: int, kept_channels: Sequence[int]) -> None:
        mlp = self._mlp(layer)
        if mlp is None:
            if kept_channels:
                raise ValueError(f"layer {layer}: the MLP is already removed")
            return
        if not kept_channels:
            release_file_pages(p.data for p in mlp.parameters())
            remove_sub_block_(self.layers[layer], "mlp", self.sub_block_norms)
            return
        channels = sorted({int(c) for c in kept_channels})
        inter = mlp.down_proj.in_features
        if channels[0] < 0 or channels[-1] >= inter:
            raise ValueError(f"layer {layer}: channel ids must lie in [0, {inter})")
        ids = torch.tensor(channels, device=mlp.down_proj.weight.device)
        mlp.gate_proj = slice_linear(mlp.gate_proj, rows=ids)  # (kept, hidden)
        mlp.up_proj = slice_linear(mlp.up_proj, rows=ids)
        mlp.down_proj = slice_linear(mlp.down_proj, cols=ids)  # (hidden, kept)
        if hasattr(mlp, "intermediate_size"):
            mlp.intermediate_size = len(channels)
