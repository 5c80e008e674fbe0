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

from gapprune.allocate import ALLOCATORS, Allocation, LayerSignals, LossTable
from gapprune.calibrate import CalibrationStats, LayerInputs, capture_layer_inputs, stats_hooks
from gapprune.calibrate.signals import layer_signals
from gapprune.config import PruneConfig
from gapprune.data import bos_token_id, load_text, sample_windows, self_generated_windows, tokenize_text
from gapprune.distributed import gather_table, shard_layers
from gapprune.importance import ScoringContext, UnitScores, accumulate_gradients, score_units
from gapprune.models import ModelAdapter, get_adapter
from gapprune.models.loading import default_cache_dir
from gapprune.models.streaming import is_streamed
from gapprune.profiling import build_loss_table
from gapprune.profiling.auto import auto_table
from gapprune.profiling.batched import (
    Compensated,
    Compensation,
    Entries,
    Measured,
    build_loss_table_batched,
    dense_base,
    dense_head_reference,
    measure_entries,
)
from gapprune.profiling.checkpoint import LayerCheckpoint, run_key
from gapprune.profiling.conditional import conditional_loss_table, true_loss
from gapprune.profiling.fisher import build_loss_table_fisher
from gapprune.profiling.layer_major import build_loss_table_layer_major
from gapprune.profiling.loss_table import calibration_tokens, option_grid
from gapprune.prune import Plan, default_channel_step, make_plan
from gapprune.prune.compensate import GramStats, compensated_projection, gram_hooks, prune_and_compensate_
from gapprune.prune.sequential import prune_sequentially_

log = logging.getLogger(__name__)

PROFILE_FILES = ("profile.json", "scores.json", "signals.json", "loss_table.json")
# Settings that decide a profile's numbers; a saved profile is reused only when they match.
PROFILE_SETTINGS = ("criterion", "metric", "calib", "calib_split", "calib_samples", "profile_samples",
                    "seq_len", "seed", "channel_step", "table_compensation")
# How the table is measured: part of a checkpoint's key, not of a profile's identity (any table of the same
# model, data and settings can be reused; `auto` completes an estimated one where a plan needs it).
TABLE_SETTINGS = (*PROFILE_SETTINGS, "profiler", "mlp_stride")
# Settings added after profiles were first saved: left out of the fingerprint at these values, so
# those profiles stay valid.
LATER_SETTINGS = {"table_compensation": "none"}


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


def step_of(adapter: ModelAdapter, config: PruneConfig) -> int:
    """MLP channels per option: the configured step, else the default for this width."""
    return config.channel_step or default_channel_step(adapter.layer_shape(0).intermediate)


def needs_loss_table(config: PruneConfig) -> bool:
    """Only GAP reads ΔL; the baselines need the options' parameter costs alone."""
    return config.allocator == "gap"


def measure_table(calibration: Calibration, config: PruneConfig, checkpoint_dir: Path | None = None,
                  complete: bool = True) -> LossTable:
    """The loss table by the configured profiler; exact rows are checkpointed per layer and resumed.

    `auto` without `complete` stops at the estimate: `complete_table` finishes it for a ratio later.
    """
    adapter, scores = calibration.adapter, calibration.scores
    total = sum(p.numel() for p in adapter.model.parameters())
    step = step_of(adapter, config)
    if not needs_loss_table(config):
        return build_loss_table(adapter, calibration.profile_inputs, scores, channel_step=step, measure=False)
    if config.profiler == "fisher":
        return build_loss_table_fisher(adapter, calibration.ids, scores, metric=config.metric, channel_step=step,
                                       batch_size=config.batch_size, seed=config.seed)
    if config.compensation_aware and is_streamed(adapter.model):
        raise ValueError("the compensation-aware table is not measured on a streamed model; drop "
                         "--compensation-aware or load the model in memory (--offload off)")
    if config.profiler == "auto" and not is_streamed(adapter.model):
        estimate = screen_table(calibration, config)
        return complete_table(calibration, estimate, config, total) if complete else estimate
    if config.profiler == "auto":  # a replay of a streamed model reads every later layer from disk again
        log.info("auto profiler on a streamed model: measuring the whole exact table, one pass over the weights")
    key = run_key({"fingerprint": calibration.fingerprint(config, TABLE_SETTINGS),
                   "profile_tokens": calibration_tokens(calibration.profile_inputs)})
    checkpoint = LayerCheckpoint(checkpoint_dir or default_cache_dir() / "tables", key)
    done = checkpoint.load()
    if done:
        log.info("resuming the loss table: %d of %d layers already measured", len(done), adapter.n_layers)
    layers = shard_layers(adapter.n_layers)  # this rank's start layers: all of them outside torchrun
    # a streamed model reads each layer once: traverse the decoder once instead of once per start layer
    build = build_loss_table_layer_major if is_streamed(adapter.model) else build_loss_table_batched
    extra = {"compensation": table_compensation(calibration, config)} if config.compensation_aware else {}
    table = build(adapter, calibration.profile_inputs, scores, metric=config.metric, channel_step=step,
                  mlp_stride=config.mlp_stride, layers=layers, done=done, on_layer=checkpoint.save, **extra)
    table = gather_table(table, layers)
    checkpoint.clear()
    return table


def table_compensation(calibration: Calibration, config: PruneConfig) -> Compensation | None:
    """With `compensation_aware`, each option's output projection as `compensate` will leave it,
    refitted out of sample.

    The table's ΔL is measured on the first calibration windows, which lie in the first batch and
    so in the half the saved model's refit is fitted on; measured there, a refit looks better than
    it generalises (measured: the allocation then over-trusts compensation, 102.8 vs 96.1 WikiText-2
    and 222.7 vs 167.1 PTB at 25%, docs/results.md). The table's refits are therefore fitted on the
    other half, so each ΔL says what compensation does on tokens it was not fitted to.
    """
    if not config.compensation_aware:
        return None
    if calibration.gram is None:
        raise ValueError("the compensation-aware table needs the Gram statistics of the calibration pass")
    if config.profile_samples > config.batch_size:
        log.warning("the profiling windows span %d calibration batches: the compensation-aware table is "
                    "partly measured on its own fit", -(-config.profile_samples // config.batch_size))
    adapter, gram = calibration.adapter, calibration.gram.swapped()

    def compensated(layer: int, component: str, kept: list[int]) -> Compensated | None:
        return compensated_projection(adapter, layer, component, kept, gram, config.compensate, config.ridge)

    return compensated


def screen_table(calibration: Calibration, config: PruneConfig) -> LossTable:
    """The auto profiler's estimate: the exact metric on the first `screen_samples` profiling windows.

    Same replays, same metric, same option grid as the exact table, on a fraction of its tokens
    (128 of 1,024 by default: ~9% of its time), so it is valid wherever the exact table is (unlike
    a second-order estimate, which misses e.g. Gemma's whole-sub-block options). No entry is exact.
    """
    adapter = calibration.adapter
    layers = shard_layers(adapter.n_layers)
    table = build_loss_table_batched(adapter, calibration.profile_inputs.first(config.screen_samples),
                                     calibration.scores, metric=config.metric, channel_step=step_of(adapter, config),
                                     mlp_stride=config.mlp_stride, layers=layers,
                                     desc=f"auto: screening ({config.screen_samples} window(s))",
                                     compensation=table_compensation(calibration, config))
    table = gather_table(table, layers)
    assert table.exact is not None
    for c in table.exact:
        table.exact[c][:] = False
    table.meta["profiler"] = "screen"
    return table


def complete_table(calibration: Calibration, table: LossTable, config: PruneConfig, total_params: int) -> LossTable:
    """Measure exactly the entries of `table` that can change the GAP plan at `config.ratio` (`auto`).

    Starts from the estimates in `table` (the screen, Fisher, or a table completed for another ratio,
    whose exact entries are kept) and measures, on the exact profiler's option grid, every entry that a
    margin test says could beat a pick, until every pick is exact and no estimate can beat it.
    """
    if not table.measured:
        raise ValueError("this profile holds parameter costs only (profiled for a baseline allocator); "
                         "profile again for the gap allocator")
    adapter, scores, inputs = calibration.adapter, calibration.scores, calibration.profile_inputs
    device = next(adapter.model.parameters()).device
    budget = budget_params(total_params, config.ratio, decoder_param_count(adapter), config.ratio_of)

    reference = dense_head_reference(adapter, inputs, config.metric, device)
    base = dense_base(adapter, inputs, reference, config.metric, device)  # the ΔL zero point, once for all rounds
    compensation = table_compensation(calibration, config)

    def measure(entries: Entries) -> Measured:  # a bar per round: replays of this round's candidates
        return measure_entries(adapter, inputs, scores, table.options, entries, metric=config.metric,
                               reference=reference, base=base, desc="auto: exact replays this round",
                               compensation=compensation)

    def solve(working: LossTable) -> dict[str, list[int]]:
        return ALLOCATORS.get("gap")(working, None, budget).choice

    grid = option_grid(adapter, table.meta.get("channel_step") or step_of(adapter, config), config.mlp_stride)
    return auto_table(table, measure, solve, columns=grid.measured, margin=config.auto_margin)


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
                   decoder_param_count(calibration.adapter))


def decoder_param_count(adapter: ModelAdapter) -> int:
    return sum(p.numel() for p in adapter.layers.parameters())


def budget_params(total_params: int, ratio: float, decoder_params: int = 0, ratio_of: str = "model") -> int:
    """Parameters to remove: `ratio` of all of them (`ratio_of` model) or of the decoder layers' (decoder,
    for models whose embedding is most of the weights: Gemma 3 270M's is 63%)."""
    if not 0 < ratio < 1:
        raise ValueError(f"ratio must lie strictly between 0 and 1 (a fraction of the parameters), got {ratio}")
    if ratio_of == "decoder":
        if decoder_params <= 0:
            raise ValueError("this profile was saved before decoder parameters were counted; profile again "
                             "to prune with --ratio-of decoder")
        return round(ratio * decoder_params)
    return round(ratio * total_params)


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
    decoder = sum(p.numel() for p in adapter.layers.parameters())
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
