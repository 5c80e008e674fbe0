"""The plan check measures ΔL by the loss table's own definition, on windows calibration never saw."""

from __future__ import annotations

import copy

import pytest
import torch

from gapprune.data import held_out_windows, mixed_windows
from gapprune.evaluate.plan_check import PlanCheck
from gapprune.pipeline import prune_model_
from tests.helpers import tiny_run


def keep_all_but(plan, layer: int, component: str):  # type: ignore[no-untyped-def]
    """The plan with every component whole except `component` of `layer`."""
    one = copy.deepcopy(plan)
    for lp in one.layers:
        for name in ("attn", "mlp"):
            if (lp.layer, name) != (layer, component):
                whole = plan.layers[0].attn.params_before if name == "attn" else plan.layers[0].mlp.params_before
                part = lp.component(name)
                part.kept = list(range(4)) if name == "attn" else list(range(128))
                part.params_after, part.rate = whole, 0.0
    return one


@pytest.mark.parametrize("component", ["attn", "mlp"])
def test_one_component_pruned_alone_measures_its_table_entry(llama, token_ids, component):
    # on the profile's own windows, one pruned component's ΔL is the table's entry: same metric, same tokens
    run = tiny_run(llama, token_ids)
    width = 4 if component == "attn" else 128
    plan = next(p for p in (run.plan(r, "gap") for r in (0.3, 0.5, 0.7))
                if any(len(lp.component(component).kept) < width for lp in p.layers))
    # the largest entry: far above float32's noise in a KL (a 2e-5 entry differs by ~1e-3 of itself across CPUs)
    layer = max((lp for lp in plan.layers if len(lp.component(component).kept) < width),
                key=lambda lp: lp.component(component).loss)
    single = keep_all_but(plan, layer.layer, component)
    check = PlanCheck.before_surgery(llama, single, token_ids, "kl")
    expected = layer.component(component).loss
    assert expected > 1e-6  # something was removed
    assert check.masked_dl == pytest.approx(expected, rel=1e-3)


def test_removal_measures_what_masking_measured_and_a_whole_plan_measures_zero(llama, token_ids):
    run = tiny_run(llama, token_ids)
    plan = run.plan(0.3, "gap")
    check = PlanCheck.before_surgery(llama, plan, token_ids, "kl")
    pruned = copy.deepcopy(llama)
    prune_model_(pruned, plan, "none")
    record = check.after_surgery(pruned, plan.summary["predicted_loss"])
    assert record["measured_masked"] > 1e-5  # something was removed
    assert record["measured_saved"] == pytest.approx(record["measured_masked"], rel=1e-3)
    assert record["predicted"] == pytest.approx(plan.summary["predicted_loss"], rel=1e-5)
    whole = keep_all_but(plan, -1, "none")
    assert PlanCheck.before_surgery(llama, whole, token_ids, "kl").masked_dl == pytest.approx(0.0, abs=1e-6)


def test_nll_check_is_the_change_in_next_token_loss(llama, token_ids):
    run = tiny_run(llama, token_ids, metric="nll")
    plan = run.plan(0.3, "gap")
    layer = next(lp for lp in plan.layers if len(lp.mlp.kept) < 128)
    check = PlanCheck.before_surgery(llama, keep_all_but(plan, layer.layer, "mlp"), token_ids, "nll")
    assert check.masked_dl == pytest.approx(layer.mlp.loss, rel=1e-3, abs=1e-6)


def test_held_out_windows_share_no_token_position_with_the_calibration_windows():
    stream = torch.arange(5_000)  # a window's ids are its positions
    calibration = mixed_windows([stream], 32, 64, seed=3)
    held = held_out_windows([stream], 32, 8, 64, seed=3)
    taken = {int(i) for i in calibration.flatten()}
    assert held.shape == (8, 64)
    assert not taken & {int(i) for i in held.flatten()}
    assert len({int(i) for i in held.flatten()}) == held.numel()  # nor with each other
    assert torch.equal(held, held_out_windows([stream], 32, 8, 64, seed=3))


def test_held_out_windows_interleave_sources_and_say_when_the_text_is_too_short():
    a, b = torch.arange(4_000), torch.arange(10_000, 14_000)
    held = held_out_windows([a, b], 16, 6, 32, seed=0, bos_id=7)
    assert (held[:, 0] == 7).all()
    assert (held[0::2, 1:] < 10_000).all() and (held[1::2, 1:] >= 10_000).all()
    with pytest.raises(ValueError, match="too short for 8 held-out windows"):
        held_out_windows([torch.arange(300)], 4, 8, 64, seed=0)
