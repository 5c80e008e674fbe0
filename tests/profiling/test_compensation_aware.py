"""The compensation-aware table (`--compensation-aware`): each option replayed as it will be saved."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from gapprune.engine.head import dense_reference
from gapprune.engine.metrics import METRICS
from gapprune.engine.replay import dense_base, replay_stacked
from gapprune.models import get_adapter
from gapprune.options import kept_units
from gapprune.pruning.compensate import prune_component_and_compensate_
from tests.helpers import tiny_run


@pytest.fixture(scope="module")
def runs():
    from tests.conftest import tiny_llama

    model = tiny_llama()
    ids = torch.randint(0, 256, (16, 64), generator=torch.Generator().manual_seed(5))
    plain = tiny_run(model, ids, compensate="lsq", profile_samples=4)
    aware = tiny_run(model, ids, compensate="lsq", profile_samples=4, compensation_aware=True)
    return model, plain, aware


def test_nothing_removed_costs_zero_and_the_table_says_it_is_compensated(runs):
    _, _, aware = runs
    assert aware.table.meta["compensated"]
    for c in ("attn", "mlp"):
        assert (aware.table.loss[c][:, 0] == 0).all()
        assert np.isfinite(aware.table.loss[c]).all()


@pytest.mark.parametrize(("layer", "component", "option"), [(1, "mlp", 2), (0, "attn", 1), (1, "attn", 2)])
def test_an_entry_is_the_loss_of_the_model_pruned_and_compensated_there(runs, layer, component, option):
    model, _, aware = runs
    adapter, inputs, device = aware.adapter, aware.calibration.profile_inputs, torch.device("cpu")
    kept = kept_units(aware.calibration.scores, adapter, layer, component, aware.table.options[component][option])
    pruned = copy.deepcopy(model)
    # as `compensate_` does (the refit where it lowers the held-out error, else plain removal), fitted on
    # the half of the calibration batches that does not hold the profiling windows
    prune_component_and_compensate_(get_adapter(pruned), layer, component, kept, aware.calibration.gram.swapped(),
                                    "lsq")
    reference = dense_reference(adapter, inputs, "kl", device)
    positions = sum(METRICS.get("kl").positions(int(h.shape[0]), int(h.shape[1])) for h in inputs.final_hidden)
    with torch.inference_mode():
        base = dense_base(adapter, inputs, reference, "kl", device)
        value = replay_stacked(get_adapter(pruned), inputs, 0, "attn", [None], reference, device, 512)[0] / positions
    assert aware.table.loss[component][layer, option] == pytest.approx(value - base, rel=1e-4, abs=1e-7)


def test_compensated_options_lose_less_in_total(runs):
    _, plain, aware = runs
    for c in ("attn", "mlp"):
        assert aware.table.loss[c][:, 1:].sum() < plain.table.loss[c][:, 1:].sum()
