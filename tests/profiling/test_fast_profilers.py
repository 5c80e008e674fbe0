"""The batched exact profiler must reproduce the reference table; the Fisher estimate must track it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from gapprune.calibrate import CalibrationStats, stats_observers
from gapprune.engine.capture import capture_layer_inputs
from gapprune.engine.head import dense_reference
from gapprune.engine.masks import masked_units, stack_kwargs
from gapprune.engine.replay import replay_metric
from gapprune.importance import ScoringContext, score_units
from gapprune.models import get_adapter
from gapprune.profiling.batched import build_loss_table_batched
from gapprune.profiling.fisher import (
    build_loss_table_fisher,
    fisher_delta,
    mask_gradients,
    rank_correlation,
    spearman,
)
from gapprune.profiling.loss_table import build_loss_table


def _profile_parts(model: torch.nn.Module, ids: torch.Tensor, batch_size: int = 2):
    adapter = get_adapter(model)
    stats = CalibrationStats()
    inputs = capture_layer_inputs(adapter, ids, batch_size=batch_size, observers=stats_observers(adapter, stats), progress=False)
    return adapter, inputs, score_units(ScoringContext(adapter, stats, {}), "activation")


def llama_with_biases() -> LlamaForCausalLM:
    torch.manual_seed(3)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=256, attention_bias=True, mlp_bias=True)
    config.architectures = ["LlamaForCausalLM"]
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # transformers initialises biases to zero; make them matter
        for name, param in model.named_parameters():
            if name.endswith("proj.bias"):
                param.normal_(0, 0.5)
    return model


@pytest.mark.parametrize("metric", ["kl", "nll"])
@pytest.mark.parametrize("max_rows", [48, 4096])  # 48 rows: one option per pass; 4096: every option at once
def test_batched_profiler_reproduces_the_reference_table(tiny_model, metric, max_rows):
    ids = torch.randint(0, 256, (6, 24), generator=torch.Generator().manual_seed(1))
    adapter, inputs, scores = _profile_parts(tiny_model, ids)
    reference = build_loss_table(adapter, inputs, scores, metric=metric, channel_step=32, mlp_stride=2, progress=False)
    batched = build_loss_table_batched(adapter, inputs, scores, metric=metric, channel_step=32, mlp_stride=2,
                                       max_rows=max_rows, chunk_rows=7, progress=False)
    assert batched.options == reference.options
    for c in ("attn", "mlp"):
        assert np.array_equal(batched.removed[c], reference.removed[c])
        assert np.allclose(batched.loss[c], reference.loss[c], rtol=1e-4, atol=2e-6), c
        assert (batched.loss[c][:, 0] == 0).all()


def test_a_thinned_table_replays_every_other_column_and_interpolates_between(tiny_model):
    ids = torch.randint(0, 256, (4, 24), generator=torch.Generator().manual_seed(2))
    adapter, inputs, scores = _profile_parts(tiny_model, ids)
    full = build_loss_table_batched(adapter, inputs, scores, channel_step=16, mlp_stride=2, progress=False)
    thin = build_loss_table_batched(adapter, inputs, scores, channel_step=16, mlp_stride=2, thin=2, progress=False)
    for c in ("attn", "mlp"):
        measured = np.flatnonzero(full.exact[c][0])
        replayed = np.flatnonzero(thin.exact[c][0])
        assert replayed.tolist() == [*measured[::2].tolist(), *([measured[-1]] if len(measured) % 2 == 0 else [])]
        assert np.allclose(thin.loss[c][:, replayed], full.loss[c][:, replayed], rtol=1e-5, atol=1e-7)
        removed = thin.removed[c][0].astype(float)
        for layer in range(adapter.n_layers):
            expected = np.interp(removed, removed[replayed], full.loss[c][layer, replayed])
            assert np.allclose(thin.loss[c][layer], expected, rtol=1e-5, atol=1e-7)


def test_batched_profiler_drops_the_bias_of_a_removed_component():
    model = llama_with_biases()
    ids = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(2))
    adapter, inputs, scores = _profile_parts(model, ids)
    reference = build_loss_table(adapter, inputs, scores, channel_step=32, progress=False)
    batched = build_loss_table_batched(adapter, inputs, scores, channel_step=32, progress=False)
    for c in ("attn", "mlp"):
        assert np.allclose(batched.loss[c], reference.loss[c], rtol=1e-4, atol=2e-6), c


def test_stacking_repeats_per_sample_tensors_and_keeps_broadcast_ones():
    per_sample, shared = torch.arange(6.0).view(2, 3), torch.ones(1, 3)
    stacked = stack_kwargs({"a": per_sample, "b": (shared, per_sample), "c": None, "d": torch.arange(3)}, batch=2, copies=3)
    assert torch.equal(stacked["a"], per_sample.repeat(3, 1))
    assert stacked["b"][0] is shared and stacked["b"][1].shape == (6, 3)
    assert stacked["c"] is None and stacked["d"].shape == (3,)


def test_fisher_gradients_are_per_sample():
    """The gradient row of sample n from a batch equals the gradient of sample n alone."""
    model = get_adapter(llama_with_biases())
    ids = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(4))
    together = mask_gradients(model, ids, batch_size=4, labels="data", progress=False)
    alone = mask_gradients(model, ids, batch_size=1, labels="data", progress=False)
    assert together and together.keys() == alone.keys()
    for key in together:
        assert torch.allclose(together[key], alone[key], rtol=1e-4, atol=1e-7), key


def test_fisher_estimate_has_the_right_sign_and_tracks_single_unit_removal(tiny_model):
    """Removing one unit: exact ΔL (KL) and the Fisher estimate are both positive and rank-correlated.

    Measured on the three tiny families with 16 x 24 tokens: Spearman 0.60-0.81 per MLP layer;
    pooled over all layers and units it is higher. The threshold 0.5 leaves room for seeds.
    """
    ids = torch.randint(0, 256, (16, 24), generator=torch.Generator().manual_seed(1))
    adapter, inputs, _ = _profile_parts(tiny_model, ids, batch_size=4)
    grads = mask_gradients(adapter, ids, batch_size=4, labels="model", progress=False)
    exact, estimate = [], []
    with torch.inference_mode():
        reference = dense_reference(adapter, inputs, "kl", torch.device("cpu"))
        for layer in range(adapter.n_layers):
            base = replay_metric(adapter, inputs, layer, "kl", reference, torch.device("cpu"))
            n = grads[(layer, "mlp")].shape[1]
            for unit in range(0, n, 4):
                with masked_units(adapter, layer, "mlp", [i for i in range(n) if i != unit]):
                    exact.append(replay_metric(adapter, inputs, layer, "kl", reference, torch.device("cpu")) - base)
                removed = torch.zeros(n)
                removed[unit] = 1
                estimate.append(fisher_delta(grads[(layer, "mlp")], removed, ids.shape[1]))
    assert min(exact) > 0 and min(estimate) > 0
    assert spearman(np.array(exact), np.array(estimate)) > 0.5


def test_fisher_table_correlates_with_the_exact_table(tiny_model, request):
    """Measured on the tiny families (16 x 24 tokens, kl): Spearman 0.90-0.94 over all options."""
    if tiny_model.config.model_type == "gemma3_text":
        # A norm after each sub-block makes its output scale-free: removing every unit is a pure
        # rescale the norm undoes up to exactly zero, so the Fisher form puts ~0 on whole-block
        # removal (exact: the largest losses). Spearman 0.26 here; 0.97 / 0.77 without those options.
        request.applymarker(pytest.mark.xfail(reason="Fisher misses post-norm sub-block removal", strict=True))
    ids = torch.randint(0, 256, (16, 24), generator=torch.Generator().manual_seed(1))
    adapter, inputs, scores = _profile_parts(tiny_model, ids, batch_size=4)
    exact = build_loss_table_batched(adapter, inputs, scores, channel_step=32, progress=False)
    fisher = build_loss_table_fisher(adapter, ids, scores, channel_step=32, batch_size=4, progress=False)
    assert fisher.options == exact.options
    assert (fisher.loss["mlp"][:, 0] == 0).all() and (fisher.loss["attn"][:, 1:] > 0).all()
    assert rank_correlation(exact, fisher) > 0.8
