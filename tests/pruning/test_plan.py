from __future__ import annotations

import copy

import pytest
import torch

from gapprune.allocate import ALLOCATORS, InfeasibleBudget
from gapprune.budget import RatioBudget, solver
from gapprune.pipeline import Profile, allocate, prune_model_, refine_allocation
from gapprune.profiling.conditional import true_loss
from gapprune.pruning import Plan
from tests.helpers import tiny_run


def logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=ids).logits


@pytest.fixture
def run(llama, token_ids):
    return tiny_run(llama, token_ids)


@pytest.fixture
def profile(run):
    return run.profile


@pytest.mark.parametrize("allocator", ALLOCATORS.names())
def test_every_allocator_meets_the_budget_and_surgery_matches_the_plan(llama, run, profile, allocator):
    plan = run.plan(0.3, allocator, profile=profile)
    assert plan.summary["achieved_ratio"] >= 0.3
    model = copy.deepcopy(llama)
    prune_model_(model, plan)
    assert sum(p.numel() for p in model.parameters()) == plan.summary["params_after"]


def test_gap_minimises_the_predicted_loss_among_allocators(profile):
    gap = allocate(profile, 0.3, "gap").predicted_loss(profile.table)
    for name in ("uniform", "global", "owl", "depth"):
        assert gap <= allocate(profile, 0.3, name).predicted_loss(profile.table) + 1e-12


def test_plan_round_trips_and_a_loaded_plan_gives_identical_logits(llama, run, profile, token_ids, tmp_path):
    plan = run.plan(0.4, "gap", profile=profile)
    plan.save(tmp_path / "plan.json")
    loaded = Plan.load(tmp_path / "plan.json")
    assert loaded.to_dict() == plan.to_dict()
    a, b = copy.deepcopy(llama), copy.deepcopy(llama)
    prune_model_(a, plan)
    prune_model_(b, loaded)
    assert torch.equal(logits(a, token_ids), logits(b, token_ids))
    for lp in loaded.layers:
        assert lp.attn.kept == sorted(lp.attn.kept) and lp.mlp.kept == sorted(lp.mlp.kept)


def test_budget_beyond_everything_prunable_is_a_clear_error(profile):
    with pytest.raises(InfeasibleBudget, match="at most .* are prunable"):
        allocate(profile, 0.99, "gap")


@pytest.mark.parametrize("allocator", ["gap", "uniform"])
def test_a_decoder_ratio_removes_that_fraction_of_the_decoder_layers(run, profile, allocator, tmp_path):
    decoder = sum(p.numel() for p in run.adapter.layers.parameters())
    assert profile.decoder_params == decoder < profile.total_params
    plan = run.plan(0.5, allocator, "decoder", profile=profile)
    assert plan.summary["decoder_ratio"] >= 0.5 and plan.summary["params_removed"] < 0.5 * profile.total_params
    by_model = run.plan(0.5, allocator, profile=profile)
    assert by_model.summary["achieved_ratio"] >= 0.5 > plan.summary["achieved_ratio"]
    profile.save(tmp_path)
    assert Profile.load(tmp_path).budget(0.5, "decoder") == profile.budget(0.5, "decoder") == round(0.5 * decoder)


def test_a_profile_without_a_decoder_count_refuses_a_decoder_ratio_and_says_why(profile):
    profile.decoder_params = 0
    with pytest.raises(ValueError, match="profile again"):
        allocate(profile, 0.5, "gap", "decoder")
    assert allocate(profile, 0.5, "gap").removed_params(profile.table) >= 0.5 * profile.total_params


def test_ratio_outside_unit_interval_is_rejected(profile):
    with pytest.raises(ValueError, match="between 0 and 1"):
        allocate(profile, 1.5, "gap")


def gap_at(profile, ratio):
    return solver(RatioBudget(ratio), "gap", profile.total_params, profile.decoder_params, profile.signals)


def test_refine_never_returns_a_worse_plan_by_true_loss(run, profile):
    inputs = run.calibration.profile_inputs
    plain = allocate(profile, 0.4, "gap")
    refined = refine_allocation(run.calibration, profile, plain, gap_at(profile, 0.4), rounds=1)
    history = refined.info["refine_history"]
    assert history[0]["true_loss"] == pytest.approx(true_loss(run.adapter, inputs, profile.scores, profile.table,
                                                              plain.choice))
    assert true_loss(run.adapter, inputs, profile.scores, profile.table, refined.choice) <= history[0]["true_loss"] + 1e-9
    assert refined.removed_params(profile.table) >= round(0.4 * profile.total_params)


def test_refining_with_a_margin_measures_less_and_its_picks_are_the_full_conditional_values(run, profile):
    from gapprune.profiling.conditional import conditional_loss_table

    inputs, table = run.calibration.profile_inputs, profile.table
    plain = allocate(profile, 0.4, "gap")
    budget = profile.budget(0.4)

    def solve(working):
        return ALLOCATORS.get("gap")(working, profile.signals, budget).choice

    full = conditional_loss_table(run.adapter, inputs, profile.scores, table, plain.choice, progress=False)
    auto = conditional_loss_table(run.adapter, inputs, profile.scores, table, plain.choice, progress=False,
                                  solve=solve, margin=0.25)
    assert auto.meta["conditional"] and auto.n_exact() < full.n_exact()
    picks = solve(auto)
    for c, per_layer in picks.items():
        for layer, k in enumerate(per_layer):
            if table.removed[c][layer, k]:
                assert auto.exact[c][layer, k]
                assert auto.loss[c][layer, k] == pytest.approx(full.loss[c][layer, k], rel=1e-5, abs=1e-9)
    chosen = ALLOCATORS.get("gap")(full, profile.signals, budget)
    assert ALLOCATORS.get("gap")(auto, profile.signals, budget).predicted_loss(full) <= \
        1.02 * chosen.predicted_loss(full) + 1e-9
    refined = refine_allocation(run.calibration, profile, plain, gap_at(profile, 0.4), rounds=1, margin=0.25)
    assert refined.info["refine_history"][1]["true_loss"] >= 0
    assert refined.removed_params(table) >= round(0.4 * profile.total_params)
