"""Gemma 3 specifics the shared contract does not reach: one KV head, both norms of a removed
sub-block, sliding-window layers with a removed attention, the 270M layer shape."""

from __future__ import annotations

import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from gapprune.engine.masks import masked_units
from gapprune.models import get_adapter
from gapprune.options import attention_options
from tests.conftest import tiny_gemma3


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=ids).logits


def test_single_kv_head_units_are_query_heads(token_ids):
    model = tiny_gemma3(n_kv_heads=1)
    adapter = get_adapter(model)
    shape = adapter.layer_shape(0)
    assert (shape.n_heads, shape.n_kv_heads) == (4, 1)
    assert attention_options(shape.n_kv_heads, shape.n_heads) == [(1, 4), (1, 3), (1, 2), (1, 1), (0, 0)]
    kept = [1, 3]
    with masked_units(adapter, 0, "attn", kept):
        masked = logits(model, token_ids)
    adapter.prune_attention_(0, kept)
    assert adapter.layer_shape(0).n_heads == 2 and adapter.layer_shape(0).n_kv_heads == 1
    assert adapter.component_params(0, "attn") == adapter.attn_option_params(0, 1, 2)
    assert torch.allclose(masked, logits(model, token_ids), atol=1e-5)


def test_removed_sub_blocks_take_both_norms_and_keep_q_k_norms_otherwise():
    model = tiny_gemma3()
    adapter = get_adapter(model)
    adapter.prune_attention_(0, [0, 1])
    attn = model.model.layers[0].self_attn
    assert attn.q_norm.weight.shape == (16,) and attn.k_norm.weight.shape == (16,)
    adapter.prune_attention_(1, [])
    adapter.prune_mlp_(1, [])
    block = model.model.layers[1]
    for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"):
        assert isinstance(getattr(block, name), torch.nn.Identity), name
    assert sum(p.numel() for p in block.parameters()) == 0


def test_generation_past_the_sliding_window_with_a_removed_sliding_attention(token_ids):
    model = tiny_gemma3()
    adapter = get_adapter(model)
    assert model.config.layer_types[2] == "sliding_attention"
    adapter.prune_attention_(2, [])
    adapter.prune_mlp_(0, list(range(0, 128, 2)))
    ids = token_ids[:1, :6]
    with torch.inference_mode():
        cached = model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=0)  # 18 > window 8
        seq = ids
        for _ in range(12):
            nxt = model(input_ids=seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], dim=1)
    assert torch.equal(cached, seq)


def test_parameter_formula_on_the_270m_layer_shape():
    """head_dim 256 with 4 heads is not hidden / n_heads (640 / 4): the formula must read head_dim."""
    config = Gemma3TextConfig(
        hidden_size=640, intermediate_size=2048, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, vocab_size=16, max_position_embeddings=64,
    )
    config.architectures = ["Gemma3ForCausalLM"]
    adapter = get_adapter(Gemma3ForCausalLM(config))
    assert adapter.component_params(0, "attn") == adapter.attn_option_params(0, 1, 4) == 10 * 256 * 640 + 2 * 640 + 2 * 256
    assert adapter.component_params(0, "mlp") == adapter.mlp_option_params(0, 2048) == 3 * 2048 * 640 + 2 * 640


def test_final_logit_softcapping_is_refused():
    model = tiny_gemma3()
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        get_adapter(model)
