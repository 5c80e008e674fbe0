from __future__ import annotations

import pytest
import torch

from gapprune.calibrate import CalibrationStats, stats_observers
from gapprune.calibrate.gram import GramStats, gram_observers
from gapprune.engine.capture import capture_layer_inputs
from gapprune.importance import CRITERIA, ScoringContext, accumulate_gradients, score_units
from gapprune.models import get_adapter
from gapprune.models.modeling_gapprune import attention_of
from tests.conftest import tiny_llama


def _context(model, ids, criterion):
    adapter = get_adapter(model)
    stats, grams = CalibrationStats(), GramStats() if criterion == "obs" else None
    hooks, gram = stats_observers(adapter, stats), gram_observers(adapter, grams) if grams is not None else None
    capture_layer_inputs(adapter, ids, batch_size=2, progress=False,
                         observers=lambda: hooks() + (gram() if gram is not None else []))
    grads = accumulate_gradients(adapter, ids, batch_size=2, progress=False) if criterion == "taylor" else {}
    return ScoringContext(adapter, stats, grads, grams)


@pytest.mark.parametrize("criterion", CRITERIA.names())
def test_one_finite_score_per_unit(tiny_model, token_ids, criterion):
    scores = score_units(_context(tiny_model, token_ids, criterion), criterion)
    adapter = get_adapter(tiny_model)
    for layer in range(adapter.n_layers):
        shape = adapter.layer_shape(layer)
        assert scores.get(layer, "attn").shape == (shape.n_heads,)
        assert scores.get(layer, "mlp").shape == (shape.intermediate,)
        assert torch.isfinite(scores.get(layer, "mlp")).all() and torch.isfinite(scores.get(layer, "attn")).all()


@pytest.mark.parametrize("criterion", ["magnitude", "activation"])
def test_unit_with_zero_output_weights_scores_lowest(llama, token_ids, criterion):
    adapter = get_adapter(llama)
    with torch.no_grad():
        adapter.out_proj(1, "mlp").weight[:, 7] = 0
        adapter.out_proj(1, "attn").weight[:, 2 * adapter.head_dim : 3 * adapter.head_dim] = 0  # head 2
        if criterion == "magnitude":  # magnitude also counts the unit's own input rows (the query rows of a head)
            adapter.component_weights(1, "mlp")[0].weight[7] = 0
            adapter.component_weights(1, "mlp")[1].weight[7] = 0
            attention_of(adapter.layers[1]).q_proj.weight[2 * adapter.head_dim : 3 * adapter.head_dim] = 0
    scores = score_units(_context(llama, token_ids, criterion), criterion)
    assert int(scores.get(1, "mlp").argmin()) == 7
    assert int(scores.get(1, "attn").argmin()) == 2


def test_unknown_criterion_suggests_a_name():
    with pytest.raises(KeyError, match="Did you mean 'activation'"):
        CRITERIA.get("activaton")


def test_gradients_refuse_a_scored_weight_that_does_not_reach_the_loss(tiny_model, token_ids, monkeypatch):
    adapter = get_adapter(tiny_model)
    stray = torch.nn.Linear(4, 4)  # not part of the model: the loss cannot depend on it
    own = adapter.component_weights
    monkeypatch.setattr(adapter, "component_weights",
                        lambda layer, component: own(layer, component) + ([stray] if layer == 0 else []))
    with pytest.raises(ValueError, match="do not reach the loss"):
        accumulate_gradients(adapter, token_ids, batch_size=2, progress=False)
    assert all(p.grad is None for p in tiny_model.parameters())  # the finally clause cleaned up


def test_half_precision_gradients_are_summed_in_float32(token_ids):
    """Each batch's bf16 gradient is added in float32: exactly the float32 sum of the per-batch gradients."""
    from gapprune.components import COMPONENTS

    model = tiny_llama().to(torch.bfloat16)
    adapter = get_adapter(model)
    weights = [lin.weight for l in range(adapter.n_layers) for c in COMPONENTS for lin in adapter.component_weights(l, c)]
    summed = accumulate_gradients(adapter, token_ids, batch_size=1, progress=False)
    expected = {id(w): torch.zeros_like(w, dtype=torch.float32) for w in weights}
    for p in model.parameters():
        p.requires_grad_(False)
    for w in weights:
        w.requires_grad_(True)
    for row in token_ids.split(1):
        model(input_ids=row, labels=row, use_cache=False).loss.backward()
        for w in weights:
            expected[id(w)] += w.grad.float()
            w.grad = None
    assert all(summed[id(w)].dtype == torch.float32 and torch.equal(summed[id(w)], expected[id(w)]) for w in weights)
