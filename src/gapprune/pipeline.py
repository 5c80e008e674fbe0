"""The one orchestrator: (model, calibration, profile, config) -> plan -> pruned model.

calibrate -> score -> profile ΔL -> allocate -> (refine) -> plan -> surgery. `Calibration` is live
(`profiling/calibration.py`); everything measured from it is numbers (`UnitScores`, `LayerSignals`,
`LossTable`, `Allocation`, `Plan`) and saves to JSON, so a `Profile` folder serves several ratios
and allocators, and a `plan.json` re-applies without profiling. The API, the CLI, the benchmarks and
the tests all get their plans from `plan_for`, so there is one way the steps are put together.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from gapprune.allocate import Allocation
from gapprune.allocate.table import LossTable
from gapprune.budget import Budget, RatioBudget, TableSolver, solver
from gapprune.budgets.table import RuntimeCosts
from gapprune.calibrate.gram import GramStats
from gapprune.config import PruneConfig
from gapprune.engine.capture import LayerInputs
from gapprune.models import ModelAdapter, get_adapter
from gapprune.phases import timed
from gapprune.profiling.auto_measure import complete_table
from gapprune.profiling.calibration import Calibration, calibrate, calibrate_on, calibration_ids
from gapprune.profiling.conditional import conditional_loss_table, true_loss
from gapprune.profiling.exact import needs_loss_table
from gapprune.profiling.profile import Profile, profile_model
from gapprune.pruning import Plan, make_plan
from gapprune.pruning.compensate import prune_and_compensate_
from gapprune.pruning.sequential import prune_sequentially_

log = logging.getLogger(__name__)

__all__ = ["Budget", "Calibration", "Profile", "allocate", "calibrate", "calibrate_on", "calibration_ids", "plan_for",
           "plan_from_allocation", "profile_model", "prune_model_", "refine_allocation"]


def plan_for(config: PruneConfig, calibration: Calibration | None = None, profile: Profile | None = None, *,
             budget: Budget | None = None, costs: RuntimeCosts | None = None, adapter: ModelAdapter | None = None,
             checkpoint_dir: Path | None = None, timings: dict[str, float] | None = None,
             **overrides: Any) -> tuple[Plan, Profile]:
    """The plan for `budget` (default: `config.ratio` of `config.ratio_of`) and the profile it used.

    `overrides` change the config first (e.g. `ratio=0.5, allocator="owl"`). Without a profile, one
    is measured from `calibration`. A given profile is checked against the calibration. With the
    `auto` profiler the table is completed for this budget, whatever its kind, by one rule: measure
    exactly what can change this budget's plan (the profile keeps the grown table, so the next
    budget measures less). Without a calibration the profile's numbers alone decide (an exact or
    already completed table), and `adapter` names the model. `costs`: the runtime's cost table, for
    a speedup or memory budget. `timings` receives this call's phases (with the calibration's);
    `profile.timings` stays what measuring the profile has cost in all, across the runs that grew it.
    """
    run_timings = timings if timings is not None else {}
    config = replace(config, **overrides) if overrides else config
    budget = budget or RatioBudget(config.ratio, config.ratio_of)
    adapter = adapter or (calibration.adapter if calibration is not None else None)
    if adapter is None:
        raise ValueError("plan_for needs a calibration or an adapter (the model the plan is for)")
    total = profile.total_params if profile is not None else sum(p.numel() for p in adapter.model.parameters())
    decoder = adapter.decoder_params()

    def complete_for() -> Callable[[LossTable], dict[str, list[int]]]:  # what the auto profiler completes for
        gap = solver(budget, "gap", total, decoder, None, costs, config.tp)
        return lambda table: gap(table).choice

    completes = config.profiler == "auto" and needs_loss_table(config)
    if profile is None:
        if calibration is None:
            raise ValueError("plan_for needs a calibration to measure a profile, or a profile")
        profile = profile_model(calibration, config, checkpoint_dir, solve=complete_for() if completes else None)
        run_timings.update(profile.timings)
    elif calibration is not None:
        run_timings.update(calibration.timings)
        profile.check_matches(calibration, config)
        profile.decoder_params = profile.decoder_params or decoder  # older profiles lack it
        if completes:  # measure what this budget's plan needs
            growth: dict[str, float] = {}
            with timed(growth, "profiling"):
                profile.table = complete_table(calibration, profile.table, config, complete_for(), checkpoint_dir)
            for phases in (run_timings, profile.timings):
                phases["profiling"] = round(phases.get("profiling", 0.0) + growth["profiling"], 3)
    with timed(run_timings, "allocation"):
        solve = solver(budget, config.allocator, profile.total_params, profile.decoder_params, profile.signals, costs,
                       config.tp)
        allocation = solve(profile.table)
        if config.refine:
            if calibration is None:
                raise ValueError("refine re-profiles around the plan: it needs a calibration")
            allocation = refine_allocation(calibration, profile, allocation, solve, config.refine, config.mlp_stride,
                                           margin=config.auto_margin if config.profiler == "auto" else None)
    # the plan records the budget it was solved for; one in other units than a ratio claims no ratio
    plan = plan_from_allocation(adapter, profile, allocation, {**config.to_dict(), **budget.plan_ratio()})
    plan.summary["budget"] = budget.to_record()
    plan.summary["choice"] = allocation.choice  # the option index per component and layer
    plan.summary["chosen_exact"] = profile.table.chosen_exact(allocation.choice)
    return plan, profile


def allocate(profile: Profile, ratio: float, allocator: str, ratio_of: str = "model") -> Allocation:
    """Choose one option per component so that `ratio` of the parameters go: numbers in, numbers out."""
    return solver(RatioBudget(ratio, ratio_of), allocator, profile.total_params, profile.decoder_params,
                  profile.signals)(profile.table)


def refine_allocation(calibration: Calibration, profile: Profile, allocation: Allocation, solve: TableSolver, rounds: int,
                      mlp_stride: int = 1, margin: float | None = None) -> Allocation:
    """Re-profile ΔL around the plan and re-solve (`solve`: the budget's) `rounds` times; keep the plan
    with the best true loss.

    `margin` None measures every option of every component around the plan; a number measures, by
    the auto profiler's rule, only what could change the re-solved plan (the `auto` profiler's way).
    """
    if not solve.by_options:
        raise ValueError("refinement re-solves the table's options around the plan: it applies to the gap allocator "
                         "only")
    adapter, scores, table, inputs = calibration.adapter, profile.scores, profile.table, calibration.profile_inputs
    best, best_loss = allocation, true_loss(adapter, inputs, scores, table, allocation.choice)
    history = [{"round": 0, "true_loss": best_loss, "predicted_loss": allocation.predicted_loss(table)}]
    current = allocation

    def choice(working: LossTable) -> dict[str, list[int]]:
        return solve(working).choice

    for round_ in range(1, rounds + 1):
        if margin is None:  # every option around the plan
            conditional = conditional_loss_table(adapter, inputs, scores, table, current.choice, mlp_stride)
        else:  # only what can change the re-solved plan
            conditional = conditional_loss_table(adapter, inputs, scores, table, current.choice, mlp_stride,
                                                 solve=choice, margin=margin)
        candidate = solve(conditional)
        candidate.info["refine_round"] = round_
        loss = true_loss(adapter, inputs, scores, table, candidate.choice)
        history.append({"round": round_, "true_loss": loss, "predicted_loss": candidate.predicted_loss(conditional)})
        log.info("refine round %d: true loss %.5f (best %.5f)", round_, loss, best_loss)
        if loss < best_loss:
            best, best_loss = candidate, loss
        current = candidate
    best.info["refine_history"] = history
    best.info["refine_helped"] = best is not allocation
    return best


def plan_from_allocation(adapter: ModelAdapter, profile: Profile, allocation: Allocation,
                         config: dict[str, Any]) -> Plan:
    table = profile.table
    plan = make_plan(adapter, profile.scores, allocation.options(table), allocation.losses(table), config)
    decoder = adapter.decoder_params()
    removed = plan.params_removed
    plan.summary = {
        "allocator": allocation.allocator,
        "params_before": profile.total_params,
        "params_after": profile.total_params - removed,
        "params_removed": removed,
        "achieved_ratio": round(removed / profile.total_params, 6),
        "decoder_params_before": decoder,
        "decoder_ratio": round(removed / decoder, 6),
        # a cost-only table (an allocator that does not read ΔL) predicts nothing: None, not a sum of zeros
        "predicted_loss": allocation.predicted_loss(table) if table.measured else None,
        "allocation_info": allocation.info,
        "emptied_layers": [lp.layer for lp in plan.layers if not lp.attn.kept and not lp.mlp.kept],
    }
    if len(plan.summary["emptied_layers"]) == len(plan.layers):
        log.warning("the plan empties every decoder layer: what is left maps embeddings straight to the head; "
                    "ask for a smaller ratio")
    return plan


def prune_model_(model: PreTrainedModel, plan: Plan, compensate: str = "none", gram: GramStats | None = None,
                 ridge: float = 1.0, sequential_inputs: LayerInputs | None = None) -> dict[str, Any]:
    """Apply a plan to a dense model in place (physical removal), then optionally compensate: on the
    dense inputs' Grams, or with `sequential_inputs` (the calibration's layer inputs) layer by layer
    on the inputs the already-pruned layers produce."""
    if sequential_inputs is not None:
        return prune_sequentially_(get_adapter(model), plan, sequential_inputs, compensate, ridge)
    return prune_and_compensate_(get_adapter(model), plan, compensate, gram, ridge)
