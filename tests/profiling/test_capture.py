"""The layer-major calibration pass caches what the model's own forward computes, visits each layer
once, and takes a layer's Grams while it runs: the same matrices a later replay gives."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

from gapprune.calibrate import CalibrationStats, stats_observers
from gapprune.calibrate import gram as gram_module
from gapprune.calibrate.gram import LayerGrams, add_upper_, mirror_upper_, upper_blocks
from gapprune.engine.capture import LayerInputs, capture_layer_inputs
from gapprune.models import get_adapter
from gapprune.models.streaming import open_streamed, streamer_of
from tests.conftest import FAMILIES

IDS = torch.arange(96).view(4, 24) * 7 % 250


def forward_inputs(model: torch.nn.Module, ids: torch.Tensor) -> tuple[list[list[torch.Tensor]], list[torch.Tensor]]:
    """Every layer's input and the final norm's, per batch of two windows, from the ordinary forward."""
    adapter = get_adapter(model)
    seen: list[list[torch.Tensor]] = [[] for _ in range(adapter.n_layers)]
    final: list[torch.Tensor] = []
    handles = [layer.register_forward_pre_hook(lambda m, a, k, i=i: seen[i].append((a[0] if a else k["hidden_states"]).clone()),
                                               with_kwargs=True) for i, layer in enumerate(adapter.layers)]
    handles.append(adapter.final_norm().register_forward_pre_hook(lambda m, a: final.append(a[0].clone())))
    with torch.inference_mode():
        for start in range(0, ids.shape[0], 2):
            model.get_decoder()(input_ids=ids[start : start + 2], use_cache=False)
    for handle in handles:
        handle.remove()
    return seen, final


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_capture_caches_the_ordinary_forwards_layer_inputs_bit_for_bit(family):
    model = FAMILIES[family]()
    inputs = capture_layer_inputs(get_adapter(model), IDS, batch_size=2, progress=False)
    seen, final = forward_inputs(model, IDS)
    assert inputs.n_batches == 2 and len(inputs.kwargs[3]) == 2
    for layer in range(4):
        for got, want in zip(inputs.hidden[layer], seen[layer], strict=True):
            assert torch.equal(got, want), (family, layer)
    for got, want in zip(inputs.final_hidden, final, strict=True):
        assert torch.equal(got, want)
    assert all(torch.equal(a, b) for a, b in zip(inputs.input_ids, IDS.split(2), strict=True))


def test_a_streamed_model_reads_each_layer_once_in_the_capture_pass(tiny_model_folder, tmp_path):
    folder, _ = tiny_model_folder
    streamed = open_streamed(folder, scratch_dir=tmp_path)
    streamer = streamer_of(streamed)
    assert streamer is not None
    adapter, stats = get_adapter(streamed), CalibrationStats()
    capture_layer_inputs(adapter, IDS, batch_size=1, observers=stats_observers(adapter, stats), progress=False)
    assert streamer.loads == 4  # four batches, four layers: batch by batch, and installing the hooks, it was twenty
    assert stats.get(3, "mlp_out").count > 0  # the hooks, installed on layers not loaded, took their statistics


def test_the_upper_triangle_and_its_mirror_are_the_whole_product():
    torch.manual_seed(0)
    parts = [torch.randn(300, 2100), torch.randn(200, 2100)]
    assert upper_blocks(2100) == [(0, 1050), (1050, 2100)] and upper_blocks(1500) == [(0, 1500)]
    target = torch.zeros(2100, 2100)
    for x in parts:
        add_upper_(target, x)
    assert not target[1050:, :1050].any()  # only the blocks on and above the diagonal so far
    mirror_upper_(target)
    assert torch.equal(target, target.T)
    torch.testing.assert_close(target, sum(x.T @ x for x in parts), rtol=1e-5, atol=1e-3)


def test_grams_taken_in_the_capture_pass_equal_a_replays(monkeypatch):
    monkeypatch.setattr(gram_module, "UPPER_BLOCK", 32)  # the tiny MLP (128 wide) in four blocks
    model = FAMILIES["qwen2"]()
    adapter = get_adapter(model)
    grams = LayerGrams(adapter)
    taken: dict[tuple[int, str], list[torch.Tensor]] = {}

    @contextlib.contextmanager
    def around_layer(layer: int, inputs: LayerInputs) -> Iterator[None]:
        with grams.accumulating(layer, inputs.hidden[layer]):
            yield
        taken.update({key: [grams.fit[key].clone(), grams.held_out[key].clone()] for key in grams.fit})

    grams.inputs = capture_layer_inputs(adapter, IDS, batch_size=1, around_layer=around_layer, progress=False)
    assert grams.replays == 0 and len(taken) == 8
    grams.release()
    for layer in (3, 0):
        grams.ensure(layer)
        for component in ("attn", "mlp"):
            fit, held_out = taken[(layer, component)]
            assert torch.equal(grams.fit[(layer, component)], fit) and torch.equal(grams.held_out[(layer, component)], held_out)
            assert torch.equal(fit, fit.T) and fit.diagonal().gt(0).all()
    assert grams.replays == 2
    with pytest.raises(ValueError, match="layer inputs"):
        LayerGrams(adapter).ensure(0)


def test_an_adapter_whose_layers_are_not_the_models_own_is_named(monkeypatch):
    model = FAMILIES["llama"]()
    adapter = get_adapter(model)
    copy = torch.nn.ModuleList(list(model.model.layers))
    monkeypatch.setattr(type(adapter), "layers", property(lambda self: copy))
    with pytest.raises(RuntimeError, match="decoder layers as a submodule"):
        capture_layer_inputs(adapter, IDS, batch_size=2, progress=False)
