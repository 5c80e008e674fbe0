"""High-level entry points shared by the Python API and the CLI."""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gapprune.budget import Budget, RatioBudget
from gapprune.budgets.table import RuntimeCosts
from gapprune.calibrate.gram import GramStats
from gapprune.components import COMPONENTS
from gapprune.config import PruneConfig
from gapprune.distributed import is_main
from gapprune.engine.capture import LayerInputs
from gapprune.evaluate.plan_check import PlanCheck
from gapprune.export.save import save, write_atomically
from gapprune.models import ModelAdapter, get_adapter
from gapprune.models.loading import load_model
from gapprune.models.streaming import is_streamed
from gapprune.phases import timed
from gapprune.pipeline import Profile, calibrate, plan_for, profile_model, prune_model_
from gapprune.profiling.calibration import held_out_ids
from gapprune.profiling.profilers import check_supported
from gapprune.pruning.plan import Plan

log = logging.getLogger(__name__)


def load(spec: str, device: str = "cpu", dtype: str | torch.dtype | None = None,
         offload: str = "off") -> tuple[PreTrainedModel, PreTrainedTokenizerBase | None]:
    """Load a dense or gapprune-pruned model (no remote code needed) and its tokenizer.

    `dtype`: float32, bfloat16, float16 or auto/None (the checkpoint's own on a GPU, float32 on a
    CPU); the weights keep it through surgery and saving. `offload` "on" leaves the decoder layers
    of a local safetensors folder on disk, read one at a time (`models/streaming.py`); "auto" does
    so when the run would take over half the free memory.
    """
    if offload != "off":
        from transformers import AutoTokenizer

        from gapprune.models.loading import read_config, resolve_dtype, resolve_model_source
        from gapprune.models.streaming import auto_stream_warning, open_streamed, should_stream

        source = resolve_model_source(spec)
        dtype = resolve_dtype(dtype, device, read_config(source))
        if should_stream(source, offload, dtype, device=str(device)):
            if offload == "auto":  # a choice the user did not make: say why, what it costs, how to undo it
                log.warning(auto_stream_warning(source, dtype, device=str(device)))
            else:
                log.info("streaming the decoder layers of %s from disk", source)
            return open_streamed(source, dtype=dtype, device=device), AutoTokenizer.from_pretrained(source)
    return load_model(spec, device=device, dtype=dtype)


def check_prunable(spec: str, plan: Plan | None = None) -> Any:
    """Refuse, before any weights load, a model whose family gapprune cannot prune, or a plan that does
    not fit it (one line, no traceback); returns the model's config for further checks."""
    from gapprune.models.adapter import ADAPTERS
    from gapprune.models.loading import read_config, resolve_model_source
    from gapprune.pruning.validate import check_plan, shapes_from_config

    config = read_config(resolve_model_source(spec))
    ADAPTERS.adapter_class(config)
    if plan is not None:
        check_plan(plan, shapes_from_config(config))
    return config


def require_tokenizer(tokenizer: PreTrainedTokenizerBase | None, spec: str,
                      purpose: str = "pruning calibrates on text") -> PreTrainedTokenizerBase:
    """Calibration, evaluation and tuning read text: a folder saved without its tokenizer is refused
    before any work, not deep inside it."""
    if tokenizer is None:
        raise ValueError(f"{spec} has no tokenizer (no tokenizer files in the folder); {purpose}: save the "
                         "tokenizer into the folder (tokenizer.save_pretrained) or use the original model")
    return tokenizer


def profile(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, config: PruneConfig,
            checkpoint_dir: Path | None = None) -> Profile:
    """Measure the dense model once (scores, signals, loss table); `Profile.save` keeps it for reuse.

    With the `auto` profiler the table stays an estimate here: each later prune measures exactly
    what its own ratio's plan needs, and the output folder keeps the grown table.
    """
    check_supported(config, streamed=is_streamed(model))
    return profile_model(calibrate(model, tokenizer, config), config, checkpoint_dir)


def prune(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    config: PruneConfig,
    profile: Profile | None = None,
    plan: Plan | None = None,
    checkpoint_dir: Path | None = None,
    timings: dict[str, float] | None = None,
    budget: Budget | None = None,
    costs: RuntimeCosts | None = None,
) -> tuple[Plan, Profile | None]:
    """Prune `model` in place by `config`; returns the plan and the (reusable) dense profile.

    `profile`: a profile of this model measured before (it must match the model and settings);
    `plan`: apply this plan as it is (no profiling; calibration still runs when compensating).
    `budget`: how much to remove, instead of `config.ratio` (a speedup or memory size with the
    runtime's `costs`).
    `timings` receives this run's phase times (a reused profile keeps its own in `profile.timings`).
    """
    check_supported(config, streamed=is_streamed(model), plan_given=plan is not None)
    adapter = get_adapter(model)
    if plan is None:
        budget = budget or RatioBudget(config.ratio, config.ratio_of)
        budget.check_model(sum(p.numel() for p in model.parameters()), adapter.decoder_params())
        if config.criterion == "obs" and config.compensate != "lsq":
            log.warning("the obs criterion orders units for the re-fit that lsq applies; with compensate=%s "
                        "criterion=activation removes less harmful units (docs/usage.md, Criteria)", config.compensate)
    needs_calibration = plan is None or config.compensate != "none"
    reused = profile.scores if profile is not None else None  # checked against this model in plan_for
    # a given plan names its kept units: its calibration only compensates, so no unit scoring (OBS on
    # a 1.5B model is a quarter of an hour)
    calibration = calibrate(model, tokenizer, config, scores=reused, score=plan is None) if needs_calibration else None
    timings = timings if timings is not None else {}
    if plan is None:
        plan, profile = plan_for(config, calibration, profile, budget=budget, costs=costs, adapter=adapter,
                                 checkpoint_dir=checkpoint_dir, timings=timings)
    else:
        timings.update(calibration.timings if calibration is not None else {})
        plan = Plan(plan.layers, {**plan.config, "compensate": config.compensate, "ridge": config.ridge},
                    dict(plan.summary))
    if not is_main():  # under torchrun only rank 0 changes the model (and writes it)
        return plan, profile
    check = None
    if "predicted_loss" in plan.summary and tokenizer is not None and not is_streamed(model):  # check additivity
        with timed(timings, "plan_check"):
            try:
                windows = held_out_ids(tokenizer, config)
            except ValueError as err:  # a short calibration file: every position already calibrated on
                log.warning("plan check skipped: %s", err)
                plan.summary["plan_check"], windows = {"skipped": str(err)}, None
            check = PlanCheck.before_surgery(model, plan, windows, config.metric) if windows is not None else None
    with timed(timings, "surgery_and_compensation"):
        biases_before = _out_proj_bias_params(adapter)
        gram = calibration.gram if calibration is not None else None
        sequential = None
        if uses_sequential(model, config) and calibration is not None:
            # it replays from layer 0: the deeper layers' cached inputs and the importance Grams can go
            sequential, gram = calibration.inputs.first_layer_only(), None
        del calibration
        plan.summary["compensation"] = prune_model_(model, plan, config.compensate, gram, config.ridge, sequential)
    if check is not None:
        with timed(timings, "plan_check"):
            plan.summary["plan_check"] = check.after_surgery(model, plan.summary["predicted_loss"])
        del check
    added = _out_proj_bias_params(adapter) - biases_before  # bias compensation adds (hidden,) per component
    plan.summary["params_after_with_added_biases"] = plan.summary["params_after"] + added
    # achieved_ratio counts the units removed; this one also counts what compensation added back
    plan.summary["achieved_ratio_with_added_biases"] = round(
        1 - plan.summary["params_after_with_added_biases"] / plan.summary["params_before"], 6)
    after = sum(p.numel() for p in model.parameters()) - added
    if after != plan.summary["params_after"]:
        raise RuntimeError(f"surgery left {after:,} parameters, the plan expected {plan.summary['params_after']:,}")
    return plan, profile


def uses_sequential(model: PreTrainedModel, config: PruneConfig) -> bool:
    """Sequential compensation when compensating at all, streamed or not: it goes layer by layer and
    holds one component's Grams at a time."""
    return config.sequential and config.compensate != "none"


def pruned_copy(model: PreTrainedModel, plan: Plan, compensate: str = "none", gram: GramStats | None = None,
                ridge: float = 1.0, sequential_inputs: LayerInputs | None = None) -> tuple[PreTrainedModel, dict[str, Any]]:
    """A pruned deep copy of a dense model, which stays as it is: several plans compared on one loaded model.

    Returns the copy and the compensation summary, plus `wall_s`, the seconds of surgery and compensation
    (the copy excluded).
    """
    pruned = copy.deepcopy(model)
    start = time.perf_counter()
    summary = prune_model_(pruned, plan, compensate, gram, ridge, sequential_inputs)
    return pruned, {**summary, "wall_s": round(time.perf_counter() - start, 4)}


def _out_proj_bias_params(adapter: ModelAdapter) -> int:
    outs = (adapter.out_proj(layer, c) for layer in range(adapter.n_layers) for c in COMPONENTS)
    return sum(out.bias.numel() for out in outs if out is not None and out.bias is not None)


def write_pruned_folder(
    out: str | Path,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    plan: Plan,
    profile: Profile | None,
    evaluation: list[dict[str, Any]] | None = None,
    plots: bool = True,
    overwrite: bool = False,
    run: dict[str, Any] | None = None,
    more: Callable[[Path], object] | None = None,
) -> Path:
    """The pruned model folder plus plan.json, loss_table.json, report.md, eval.json, run.json and plots;
    `more(folder)` adds files to the temporary folder before it is renamed into place."""
    from gapprune.evaluate.report import write_report

    def extras(folder: Path) -> None:
        plan.save(folder / "plan.json")
        if profile is not None:
            profile.save(folder)  # the output folder doubles as a profile folder for other ratios
        if evaluation:
            (folder / "eval.json").write_text(json.dumps(evaluation, indent=1) + "\n")
        if run:
            (folder / "run.json").write_text(json.dumps(run, indent=1) + "\n")
        if plots:
            try:
                from gapprune.evaluate.plots import plot_kept_fraction, plot_loss_table

                plot_kept_fraction(plan, folder / "kept_fraction.png", f"{plan.summary['allocator']} at {plan.config['ratio']}")
                if profile is not None:
                    plot_loss_table(profile.table, folder / "loss_table.png")
            except ImportError as err:
                log.warning("%s; skipping plots", err)
        phases = run["phases"] if run else (profile.timings if profile is not None else {})
        write_report(folder / "report.md", plan, phases, evaluation)
        if more is not None:
            more(folder)

    return save(model, tokenizer, out, extras=extras, overwrite=overwrite)


def write_profile_folder(out: str | Path, profile: Profile, overwrite: bool = False) -> Path:
    """A profile folder (profile.json, scores.json, signals.json, loss_table.json), written atomically."""
    return write_atomically(out, profile.save, overwrite=overwrite)
