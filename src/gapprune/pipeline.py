"""The pruning pipeline: calibrate -> score -> profile ΔL -> allocate -> (refine) -> plan -> surgery.

Two kinds of value flow here. `Calibration` is live (the model's adapter, cached layer inputs, input
statistics): it exists only while the model is in memory. Everything measured from it is numbers
(`UnitScores`, `LayerSignals`, `LossTable`, `Allocation`, `Plan`) and saves to JSON, so a `Profile`
folder serves several ratios and allocators, and a `plan.json` re-applies without profiling.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from gapprune.allocate import ALLOCATORS, Allocation, LayerSignals, LossTable, budget_params
from gapprune.calibrate import CalibrationStats, LayerInputs, capture_layer_inputs, stats_hooks
from gapprune.calibrate.gram import GramStats, gram_hooks
from gapprune.calibrate.signals import layer_signals
from gapprune.config import LATER_SETTINGS, PROFILE_SETTINGS, PruneConfig
from gapprune.data import bos_token_id, load_text, sample_windows, self_generated_windows, tokenize_text
from gapprune.importance import ScoringContext, UnitScores, accumulate_gradients, score_units
from gapprune.models import ModelAdapter, get_adapter
from gapprune.profiling.checkpoint import run_key
from gapprune.profiling.conditional import conditional_loss_table, true_loss
from gapprune.profiling.tables import measure_table, needs_loss_table
from gapprune.prune import Plan, make_plan
from gapprune.prune.compensate import prune_and_compensate_
from gapprune.prune.sequential import prune_sequentially_

log = logging.getLogger(__name__)

PROFILE_FILES = ("profile.json", "scores.json", "signals.json", "loss_table.json")


@contextmanager
def timed(timings: dict[str, float], phase: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    timings[phase] = round(timings.get(phase, 0.0) + time.perf_counter() - start, 3)
    log.info("%s took %.1f s", phase, timings[phase])


@dataclass
class Calibration:
    """One dense pass over the calibration set, live: layer inputs, statistics, unit scores."""

    adapter: ModelAdapter
    ids: torch.Tensor  # (n, T) calibration token ids
    inputs: LayerInputs
    stats: CalibrationStats
    scores: UnitScores
    profile_inputs: LayerInputs  # the prefix of the calibration batches the loss table is measured on
    gram: GramStats | None = None  # output-projection input Gram matrices, for compensation
    timings: dict[str, float] = field(default_factory=dict)

    def fingerprint(self, config: PruneConfig, names: tuple[str, ...] = PROFILE_SETTINGS) -> str:
        """What the numbers measured from this calibration depend on: settings, tokens, weights (via scores)."""
        settings = {name: getattr(config, name) for name in names
                    if LATER_SETTINGS.get(name, object()) != getattr(config, name)}
        shape = {"architecture": type(self.adapter.model).__name__, "n_layers": self.adapter.n_layers,
                 "hidden": self.adapter.hidden, "params": sum(p.numel() for p in self.adapter.model.parameters())}
        scores = json.dumps(self.scores.to_dict()).encode()
        return run_key({**settings, **shape}, self.ids.numpy().tobytes(), scores)


@dataclass
class Profile:
    """Everything measured on the dense model, as numbers: reusable for several ratios and allocators."""

    scores: UnitScores
    signals: LayerSignals
    table: LossTable
    total_params: int
    fingerprint: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    decoder_params: int = 0  # the decoder layers' parameters (0: a profile saved before they were counted)

    def budget(self, ratio: float, ratio_of: str = "model") -> int:
        """Parameters a plan at `ratio` (of the whole model, or of the decoder layers) removes."""
        return budget_params(self.total_params, ratio, self.decoder_params, ratio_of)

    def save(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        meta = {"total_params": self.total_params, "decoder_params": self.decoder_params,
                "fingerprint": self.fingerprint, "settings": self.settings, "timings": self.timings}
        (folder / "profile.json").write_text(json.dumps(meta, indent=1) + "\n")
        self.scores.save(folder / "scores.json")
        self.signals.save(folder / "signals.json")
        self.table.save(folder / "loss_table.json")

    @classmethod
    def load(cls, folder: str | Path) -> Profile:
        folder = Path(folder)
        missing = [name for name in PROFILE_FILES if not (folder / name).is_file()]
        if missing:
            raise FileNotFoundError(f"{folder} is not a profile folder (missing {', '.join(missing)}); "
                                    "pass the output folder of an earlier prune or profile run")
        try:
            meta = json.loads((folder / "profile.json").read_text())
            return cls(UnitScores.load(folder / "scores.json"), LayerSignals.load(folder / "signals.json"),
                       LossTable.load(folder / "loss_table.json"), int(meta["total_params"]), meta.get("fingerprint", ""),
                       meta.get("settings", {}), meta.get("timings", {}), int(meta.get("decoder_params", 0)))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{folder}/profile.json is not readable ({err}); profile again") from None

    def check_matches(self, calibration: Calibration, config: PruneConfig) -> None:
        """A profile measured on another model, data or settings must not silently steer this one."""
        expected = calibration.fingerprint(config)
        if self.fingerprint != expected:
            changed = [name for name in PROFILE_SETTINGS
                       if self.settings.get(name, LATER_SETTINGS.get(name)) != getattr(config, name)]
            detail = f"settings differ: {', '.join(changed)}" if changed else "the model weights or data differ"
            raise ValueError(f"the profile was measured for another run ({detail}); profile this model again "
                             "or use the same settings as the profile")
        if config.profiler == "exact" and needs_loss_table(config) and self.table.meta.get("profiler") != "exact":
            raise ValueError(f"the profile holds a {self.table.meta.get('profiler')} table, not an exact one; prune "
                             "with profiler auto (it measures what the plan needs) or profile again with profiler exact")


def calibration_ids(model: nn.Module, tokenizer: PreTrainedTokenizerBase, config: PruneConfig) -> torch.Tensor:
    """Calibration windows (n, T): seeded samples of a data set or file, or text the model writes."""
    if config.calib == "self":
        return self_generated_windows(model, tokenizer, config.calib_samples, config.seq_len, config.seed)
    text = load_text(config.calib, config.calib_split, config.data_dir)
    return sample_windows(tokenize_text(text, tokenizer), config.calib_samples, config.seq_len, config.seed,
                          bos_id=bos_token_id(tokenizer))


def calibrate(model: nn.Module, tokenizer: PreTrainedTokenizerBase, config: PruneConfig,
              gram: bool | None = None) -> Calibration:
    """The dense pass: layer inputs, channel statistics, Gram matrices (when compensating), unit scores."""
    timings: dict[str, float] = {}
    with timed(timings, "calibration_data"):
        ids = calibration_ids(model, tokenizer, config)
    return calibrate_on(model, ids, config, gram, timings)


def calibrate_on(model: nn.Module, ids: torch.Tensor, config: PruneConfig, gram: bool | None = None,
                 timings: dict[str, float] | None = None) -> Calibration:
    """`calibrate` on given token ids (n, T): no tokenizer or data set needed."""
    adapter = get_adapter(model)
    timings = dict(timings or {})
    stats = CalibrationStats()
    wants_gram = config.compensate != "none" or config.criterion == "obs" or config.compensation_aware
    grams = GramStats() if (wants_gram if gram is None else gram) else None
    stat_hooks, gram_hook = stats_hooks(adapter, stats), gram_hooks(adapter, grams) if grams is not None else None

    def hooks() -> list[torch.utils.hooks.RemovableHandle]:
        return stat_hooks() + (gram_hook() if gram_hook is not None else [])

    with timed(timings, "capture"):
        inputs = capture_layer_inputs(adapter, ids, batch_size=config.batch_size, extra_hooks=hooks)
    with timed(timings, "importance"):
        grads = accumulate_gradients(adapter, ids, batch_size=config.batch_size) if config.criterion == "taylor" else {}
        scores = score_units(ScoringContext(adapter, stats, grads, grams), config.criterion)
    profile_inputs = inputs.first(config.profile_samples)
    return Calibration(adapter, ids, inputs, stats, scores, profile_inputs, grams, timings)


def profile_model(calibration: Calibration, config: PruneConfig, checkpoint_dir: Path | None = None,
                  complete: bool = True) -> Profile:
    """Signals and the loss table of the calibrated dense model (`complete`: see `measure_table`)."""
    timings = dict(calibration.timings)
    with timed(timings, "signals"):
        signals = layer_signals(calibration.adapter, calibration.inputs, calibration.stats, calibration.scores)
    with timed(timings, "profiling"):
        table = measure_table(calibration, config, checkpoint_dir, complete)
    total = sum(p.numel() for p in calibration.adapter.model.parameters())
    settings = {name: getattr(config, name) for name in PROFILE_SETTINGS}
    return Profile(calibration.scores, signals, table, total, calibration.fingerprint(config), settings, timings,
                   calibration.adapter.decoder_params())


def allocate(profile: Profile, ratio: float, allocator: str, ratio_of: str = "model") -> Allocation:
    """Choose one option per component so that `ratio` of the parameters go: numbers in, numbers out."""
    return ALLOCATORS.get(allocator)(profile.table, profile.signals, profile.budget(ratio, ratio_of))


def refine_allocation(calibration: Calibration, profile: Profile, allocation: Allocation, ratio: float, rounds: int,
                      mlp_stride: int = 1, ratio_of: str = "model") -> Allocation:
    """Re-profile ΔL around the plan and re-solve `rounds` times; keep the plan with the best true loss."""
    if allocation.allocator != "gap":
        raise ValueError("refinement applies to the gap allocator only")
    adapter, scores, table, inputs = calibration.adapter, profile.scores, profile.table, calibration.profile_inputs
    budget = profile.budget(ratio, ratio_of)
    best, best_loss = allocation, true_loss(adapter, inputs, scores, table, allocation.choice)
    history = [{"round": 0, "true_loss": best_loss, "predicted_loss": allocation.predicted_loss(table)}]
    current = allocation
    for round_ in range(1, rounds + 1):
        conditional = conditional_loss_table(adapter, inputs, scores, table, current.choice, mlp_stride)
        candidate = ALLOCATORS.get("gap")(conditional, profile.signals, budget)
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
        "predicted_loss": allocation.predicted_loss(table),
        "allocation_info": allocation.info,
    }
    return plan


def prune_model_(model: nn.Module, plan: Plan, compensate: str = "none", gram: GramStats | None = None,
                 ridge: float = 1.0, sequential_inputs: LayerInputs | None = None) -> dict[str, Any]:
    """Apply a plan to a dense model in place (physical removal), then optionally compensate: on the
    dense inputs' Grams, or with `sequential_inputs` (the calibration's layer inputs) layer by layer
    on the inputs the already-pruned layers produce."""
    if sequential_inputs is not None:
        return prune_sequentially_(get_adapter(model), plan, sequential_inputs, compensate, ridge)
    return prune_and_compensate_(get_adapter(model), plan, compensate, gram, ridge)
