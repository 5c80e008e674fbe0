"""Sequential compensation: layers re-fitted in order on the inputs the pruned layers produce."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from gapprune.models import get_adapter
from gapprune.pipeline import prune_model_
from gapprune.pruning.plan import Plan
from tests.helpers import tiny_run


@pytest.fixture
def calibrated(llama):
    ids = torch.randint(0, 256, (16, 64), generator=torch.Generator().manual_seed(5))
    return llama, ids, tiny_run(llama, ids, compensate="lsq", profile_samples=2)


def uniform_plan(run, ratio=0.3):
    return run.plan(ratio, "uniform")


def test_sequential_with_nothing_removed_changes_nothing(calibrated):
    model, ids, run = calibrated
    adapter = run.adapter
    planned = uniform_plan(run)
    shapes = [adapter.layer_shape(lp.layer) for lp in planned.layers]
    keep_all = Plan([replace(lp, attn=replace(lp.attn, kept=list(range(s.n_heads)), option=[s.n_kv_heads, s.n_heads // s.n_kv_heads]),
                             mlp=replace(lp.mlp, kept=list(range(s.intermediate)), option=[s.intermediate]))
                     for lp, s in zip(planned.layers, shapes)], planned.config, planned.summary)
    out = copy.deepcopy(model)
    summary = prune_model_(out, keep_all, "lsq", run.calibration.gram, 1.0, run.calibration.inputs)
    assert summary["applied"] == 0
    with torch.inference_mode():
        assert torch.equal(model(input_ids=ids).logits, out(input_ids=ids).logits)


def test_first_attention_is_fitted_on_the_dense_inputs_and_later_components_are_not(calibrated):
    model, _, run = calibrated
    plan = uniform_plan(run)
    dense_fit, sequential = copy.deepcopy(model), copy.deepcopy(model)
    prune_model_(dense_fit, plan, "lsq", run.calibration.gram, 1.0)
    summary = prune_model_(sequential, plan, "lsq", run.calibration.gram, 1.0, run.calibration.inputs)
    assert summary["sequential"] and summary["applied"] > 0
    a, b = get_adapter(dense_fit), get_adapter(sequential)
    # layer 0's attention sees the same inputs either way: the same refit
    assert torch.allclose(a.out_proj(0, "attn").weight, b.out_proj(0, "attn").weight, atol=1e-5)
    # its MLP already sees the pruned attention: another refit
    assert not torch.allclose(a.out_proj(0, "mlp").weight, b.out_proj(0, "mlp").weight, atol=1e-5)
    assert [s.intermediate for s in a.shapes()] == [s.intermediate for s in b.shapes()]


def test_sequential_needs_a_compensation_method(calibrated):
    model, _, run = calibrated
    with pytest.raises(ValueError, match="lsq or bias"):
        prune_model_(copy.deepcopy(model), uniform_plan(run), "none", None, 1.0, run.calibration.inputs)


def test_gram_passes_that_stop_at_their_projection_fit_what_full_layer_passes_fit(calibrated, monkeypatch):
    """Each Gram pass ends at the projection whose input it takes; running the whole layer instead
    (the stop disabled) must give bit-identical compensated weights."""
    from gapprune.engine import capture

    model, _, run = calibrated
    plan = uniform_plan(run)
    stopped, full = copy.deepcopy(model), copy.deepcopy(model)
    prune_model_(stopped, plan, "lsq", None, 1.0, run.calibration.inputs.first_layer_only())
    monkeypatch.setattr(capture, "_stop", lambda module, args: None)
    prune_model_(full, plan, "lsq", None, 1.0, run.calibration.inputs)
    for (name, a), (_, b) in zip(stopped.state_dict().items(), full.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_a_layer_pruned_empty_replays_as_the_identity():
    """Sequential compensation replays every layer, the ones a plan empties too (no weights left to say the
    device and dtype): their output is their input."""
    from gapprune.engine.capture import replay_layer
    from gapprune.models import get_adapter
    from tests.conftest import tiny_llama

    adapter = get_adapter(tiny_llama())
    adapter.prune_attention_(1, [])
    adapter.prune_mlp_(1, [])
    hidden = [torch.randn(2, 5, 64)]
    kwargs = [{"position_embeddings": adapter.model.model.rotary_emb(hidden[0], torch.arange(5)[None]),
               "attention_mask": None}]
    with torch.no_grad():
        out = replay_layer(adapter, 1, hidden, kwargs)
    assert len(out) == 1 and torch.equal(out[0], hidden[0])
