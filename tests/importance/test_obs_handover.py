"""OBS scoring takes the Gram halves over from the layer cache and sums them in place: the same
orders bit for bit, no copy of either half, and a later reader of the key gets the layer replayed."""

from __future__ import annotations

import gc
import weakref

import torch

from gapprune.calibrate import CalibrationStats
from gapprune.calibrate.gram import LayerGrams
from gapprune.engine.capture import capture_layer_inputs
from gapprune.importance import ScoringContext
from gapprune.importance.obs import damped_inverse, obs, obs_order
from gapprune.models import get_adapter
from tests.conftest import tiny_llama


def halves(n: int = 24, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [(x := torch.randn(50, n, generator=g)).T @ x for _ in range(2)]


def test_handed_over_halves_give_the_borrowed_inverse_bit_for_bit_without_a_copy():
    held = halves()
    borrowed = damped_inverse([p.clone() for p in held], torch.float32)
    first_ptr, second_ref = held[0].data_ptr(), weakref.ref(held[1])

    def hand_over() -> list[torch.Tensor]:
        return [held.pop(0), held.pop(0)]  # the caller gets the only references

    inverse = damped_inverse(hand_over, torch.float32)
    gc.collect()
    assert torch.equal(inverse, borrowed)
    assert inverse.data_ptr() == first_ptr  # summed, factored and inverted in the first half's storage
    assert second_ref() is None  # the second half was freed once added


def test_a_failed_float32_factor_asks_the_handover_again_for_the_float64_retry(monkeypatch):
    parts = halves()
    calls = []

    def hand_over() -> list[torch.Tensor]:
        calls.append(1)
        return [p.clone() for p in parts]

    real = torch.linalg.cholesky_ex

    def fail_in_float32(a, *args, **kwargs):
        out = real(a, *args, **kwargs)
        if a.dtype == torch.float32:
            out[1].fill_(1)
        return out

    monkeypatch.setattr(torch.linalg, "cholesky_ex", fail_in_float32)
    inverse = damped_inverse(hand_over, torch.float32)
    assert inverse.dtype == torch.float64 and len(calls) == 2
    monkeypatch.setattr(torch.linalg, "cholesky_ex", real)
    torch.testing.assert_close(inverse, damped_inverse([p.clone() for p in parts], torch.float64), rtol=0, atol=0)


def test_obs_scoring_through_the_layer_cache_equals_borrowed_halves_and_readers_after_it_get_the_layer_again():
    model = tiny_llama()
    adapter = get_adapter(model)
    ids = torch.randint(0, 256, (4, 16), generator=torch.Generator().manual_seed(1))
    inputs = capture_layer_inputs(adapter, ids, batch_size=2, progress=False)
    stats = CalibrationStats()
    grams = LayerGrams(adapter, inputs)
    context = ScoringContext(adapter, stats, None, grams)
    reference = LayerGrams(adapter, inputs)
    for layer in range(adapter.n_layers):
        for component in ("attn", "mlp"):
            key = (layer, component)
            reference.ensure(layer)
            width = adapter.unit_width(component)
            n_units = adapter.out_proj(layer, component).in_features // width
            per_step = 1 if component == "attn" else max(1, n_units // 64)
            expected = obs_order(adapter.out_proj(layer, component).weight,
                                 [reference.fit[key], reference.held_out[key]], width, per_step)
            scores = obs(context, layer, component)
            assert scores.argsort().tolist() == expected, key
            assert key not in grams.fit and key not in grams.held_out  # handed over, not kept
        replays = grams.replays
        grams.ensure(layer)  # a later reader (compensation) finds the layer replayed, halves intact
        assert grams.replays == replays + 1
        for component in ("attn", "mlp"):
            assert torch.equal(grams.fit[(layer, component)], reference.fit[(layer, component)])
            assert torch.equal(grams.held_out[(layer, component)], reference.held_out[(layer, component)])
