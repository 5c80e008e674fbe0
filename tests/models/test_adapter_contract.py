"""One contract every model family must meet, run on tiny random models of each family."""

from __future__ import annotations

import pytest
import torch

from gapprune.engine.masks import masked_units
from gapprune.models import COMPONENTS, get_adapter


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=ids).logits


def test_rate_zero_surgery_is_a_no_op(tiny_model, token_ids):
    before = logits(tiny_model, token_ids)
    adapter = get_adapter(tiny_model)
    for layer in range(adapter.n_layers):
        shape = adapter.layer_shape(layer)
        adapter.prune_attention_(layer, list(range(shape.n_heads)))
        adapter.prune_mlp_(layer, list(range(shape.intermediate)))
    assert torch.equal(before, logits(tiny_model, token_ids))


@pytest.mark.parametrize("layer", [0, 2])
def test_removing_units_equals_masking_them(tiny_model, token_ids, layer):
    adapter = get_adapter(tiny_model)
    shape = adapter.layer_shape(layer)
    n_rep = shape.n_heads // shape.n_kv_heads
    heads = [h for h in range(shape.n_heads) if h // n_rep == 1 and h % n_rep != 0]  # group 1, all but one head
    channels = list(range(0, shape.intermediate, 3))
    with masked_units(adapter, layer, "attn", heads), masked_units(adapter, layer, "mlp", channels):
        masked = logits(tiny_model, token_ids)
    unmasked = logits(tiny_model, token_ids)
    assert not torch.allclose(masked, unmasked, atol=1e-4), "masking must change the output"
    adapter.prune_attention_(layer, heads)
    adapter.prune_mlp_(layer, channels)
    assert adapter.layer_shape(layer).n_kv_heads == 1
    assert adapter.layer_shape(layer).n_heads == len(heads)
    assert torch.allclose(masked, logits(tiny_model, token_ids), atol=1e-5)


@pytest.mark.parametrize("component", COMPONENTS)
def test_removing_a_whole_sub_block_equals_skipping_it(tiny_model, token_ids, component):
    adapter = get_adapter(tiny_model)
    with masked_units(adapter, 1, component, []):
        skipped = logits(tiny_model, token_ids)
    (adapter.prune_attention_ if component == "attn" else adapter.prune_mlp_)(1, [])
    assert adapter.out_proj(1, component) is None
    assert torch.allclose(skipped, logits(tiny_model, token_ids), atol=1e-5)


def test_parameter_counts_match_the_formula(tiny_model):
    adapter = get_adapter(tiny_model)
    shape = adapter.layer_shape(0)
    n_rep = shape.n_heads // shape.n_kv_heads
    assert adapter.component_params(0, "attn") == adapter.attn_option_params(0, shape.n_kv_heads, n_rep)
    assert adapter.component_params(0, "mlp") == adapter.mlp_option_params(0, shape.intermediate)
    total_before = sum(p.numel() for p in tiny_model.parameters())
    heads = [h for h in range(shape.n_heads) if h // n_rep == 0][: max(1, n_rep - 1)]
    adapter.prune_attention_(0, heads)
    adapter.prune_mlp_(0, list(range(40)))
    adapter.prune_attention_(1, [])
    adapter.prune_mlp_(2, [])
    assert adapter.component_params(0, "attn") == adapter.attn_option_params(0, 1, len(heads))
    assert adapter.component_params(0, "mlp") == adapter.mlp_option_params(0, 40)
    assert adapter.component_params(1, "attn") == 0 == adapter.attn_option_params(1, 0, 0)
    expected_removed = (
        adapter.attn_option_params(0, shape.n_kv_heads, n_rep) - adapter.attn_option_params(0, 1, len(heads))
        + adapter.mlp_option_params(0, shape.intermediate) - adapter.mlp_option_params(0, 40)
        + adapter.attn_option_params(1, shape.n_kv_heads, n_rep) + adapter.mlp_option_params(2, shape.intermediate)
    )
    assert total_before - sum(p.numel() for p in tiny_model.parameters()) == expected_removed


def test_shapes_are_recorded_once_as_data(tiny_model):
    adapter = get_adapter(tiny_model)
    adapter.prune_mlp_(0, list(range(16)))
    adapter.prune_attention_(3, [])
    adapter.record_shapes_()
    shapes = tiny_model.config.layer_shapes
    assert shapes[0]["intermediate_size"] == 16 and shapes[1]["intermediate_size"] == 128
    assert shapes[3]["num_attention_heads"] == 0 and shapes[3]["num_key_value_heads"] == 0
    assert tiny_model.config.intermediate_size == 128  # the global value is never overwritten


def test_uneven_heads_per_group_are_rejected(llama):
    adapter = get_adapter(llama)
    with pytest.raises(ValueError, match="same number of query heads"):
        adapter.prune_attention_(0, [0, 1, 2])  # group 0 keeps 2, group 1 keeps 1


def test_unknown_architecture_is_a_clear_error():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64))
    model.config.architectures = ["GPT2LMHeadModel"]
    with pytest.raises(ValueError, match="unsupported architecture 'GPT2LMHeadModel'.*LlamaForCausalLM"):
        get_adapter(model)
