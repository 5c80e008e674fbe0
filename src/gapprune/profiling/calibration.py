"""The dense calibration pass, live: layer inputs, channel statistics, Gram matrices and unit scores.

A `Calibration` exists only while the model is in memory; everything measured from it (scores,
signals, the loss table) is numbers and saves to JSON (`profiling/profile.py`).
"""

from __future__ import annotations

import json
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gapprune.calibrate import CalibrationStats, stats_observers
from gapprune.calibrate.gram import GramStats, LayerGrams
from gapprune.config import LATER_SETTINGS, PROFILE_SETTINGS, PruneConfig
from gapprune.data import (
    bos_token_id,
    check_source,
    held_out_windows,
    load_text,
    mixed_windows,
    self_generated_windows,
    split_for,
    tokenize_text,
)
from gapprune.engine.capture import LayerInputs, capture_layer_inputs
from gapprune.importance import ScoringContext, UnitScores, accumulate_gradients, score_layer
from gapprune.models import ModelAdapter, get_adapter
from gapprune.phases import PEAK_RSS_AFTER, timed
from gapprune.profiling.checkpoint import run_key


@dataclass
class Calibration:
    """One dense pass over the calibration set, live: layer inputs, statistics, unit scores."""

    adapter: ModelAdapter
    ids: torch.Tensor  # (n, T) calibration token ids
    inputs: LayerInputs
    stats: CalibrationStats
    scores: UnitScores | None  # None: not scored, for a given plan (it names its kept units)
    profile_inputs: LayerInputs  # the prefix of the calibration batches the loss table is measured on
    gram: GramStats | None = None  # output-projection input Gram matrices, for compensation
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def unit_scores(self) -> UnitScores:
        """The scores, for whatever profiles or plans from this calibration."""
        if self.scores is None:
            raise ValueError("this calibration was taken without unit scores (to apply a given plan); "
                             "calibrate with score=True to profile or plan")
        return self.scores

    @property
    def weights_dtype(self) -> str:
        """The dtype the model's weights are in (`float32`, `bfloat16`, ...): its numbers depend on it."""
        return str(next(self.adapter.model.parameters()).dtype).removeprefix("torch.")

    def fingerprint(self, config: PruneConfig, names: tuple[str, ...] = PROFILE_SETTINGS) -> str:
        """What the numbers measured from this calibration depend on: settings, tokens, weights (via scores)."""
        resolved = profile_settings(config, names)
        settings = {name: value for name, value in resolved.items() if LATER_SETTINGS.get(name, object()) != value}
        shape = {"architecture": type(self.adapter.model).__name__, "n_layers": self.adapter.n_layers,
                 "hidden": self.adapter.hidden, "params": sum(p.numel() for p in self.adapter.model.parameters())}
        if self.weights_dtype != "float32":  # named only then: float32 profiles saved before it still match
            shape["dtype"] = self.weights_dtype
        scores = json.dumps(self.unit_scores.to_dict()).encode()
        return run_key({**settings, **shape}, self.ids.cpu().numpy().tobytes(), scores)


def calibration_splits(config: PruneConfig) -> list[str | None]:
    """The split each calibration source reads (None for a file or `self`)."""
    requested = None if config.calib_split == "auto" else config.calib_split
    return [split_for(name, "calibration", requested) for name in config.calib_sources]


def check_calibration_sources(config: PruneConfig) -> None:
    """Refuse a calibration text that cannot be read (an unknown name or split, a missing file) before the
    model loads, not after."""
    for name, split in zip(config.calib_sources, calibration_splits(config), strict=True):
        if name != "self":
            check_source(name, split)


def profile_settings(config: PruneConfig, names: tuple[str, ...] = PROFILE_SETTINGS) -> dict[str, object]:
    """The settings a profile's numbers depend on, `calib_split` resolved to the splits actually read.

    Resolved, so that `auto` on WikiText-2 is the `validation` older profiles recorded, and C4 records
    the `train` split it calibrates on."""
    settings = {name: getattr(config, name) for name in names}
    if "calib_split" in settings:
        settings["calib_split"] = "+".join(split or "file" for split in calibration_splits(config))
    return settings


def calibration_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, config: PruneConfig) -> torch.Tensor:
    """Calibration windows (n, T): seeded samples of data sets or files, or text the model writes.

    `wikitext2+ptb` mixes sources in equal parts, interleaved, so the loss table's prefix sees each:
    a plan measured on one domain alone carries that domain's blind spots to every other."""
    if config.calib == "self":
        return self_generated_windows(model, tokenizer, config.calib_samples, config.seq_len, config.seed)
    return mixed_windows(calibration_sources(tokenizer, config), config.calib_samples, config.seq_len, config.seed,
                         bos_id=bos_token_id(tokenizer))


_TOKENISED: weakref.WeakKeyDictionary[PreTrainedTokenizerBase, dict[tuple[Any, ...], list[torch.Tensor]]] = (
    weakref.WeakKeyDictionary())


def calibration_sources(tokenizer: PreTrainedTokenizerBase, config: PruneConfig) -> list[torch.Tensor]:
    """The calibration text's token ids, one tensor per source, tokenised once per tokenizer and text:
    the calibration windows and the plan check's held-out windows are cut from the same ids."""
    splits = calibration_splits(config)
    key = (tuple(config.calib_sources), tuple(splits), str(config.data_dir))
    seen = _TOKENISED.setdefault(tokenizer, {})
    if key not in seen:
        seen.clear()  # one text per tokenizer is kept: a run calibrates on one
        seen[key] = [tokenize_text(load_text(name, split, config.data_dir), tokenizer)
                     for name, split in zip(config.calib_sources, splits, strict=True)]
    return seen[key]


def held_out_ids(tokenizer: PreTrainedTokenizerBase, config: PruneConfig) -> torch.Tensor | None:
    """`config.check_samples` windows of the calibration text that no calibration window overlaps
    (None for `self`-generated text or no check): where the plan check measures."""
    if config.calib == "self" or not config.check_samples:
        return None
    return held_out_windows(calibration_sources(tokenizer, config), config.calib_samples, config.check_samples, config.seq_len, config.seed,
                            bos_id=bos_token_id(tokenizer))


def calibrate(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, config: PruneConfig,
              gram: bool | None = None, scores: UnitScores | None = None, score: bool = True) -> Calibration:
    """The dense pass: layer inputs, channel statistics, Gram matrices (when compensating), unit scores.

    `scores`: a saved profile's unit scores, reused instead of scored again (obs on a 1.5B model is
    minutes); `Profile.check_matches` then checks the weights through freshly measured layer signals.
    `score=False`: no scores at all, for compensating a given plan (it names its kept units)."""
    timings: dict[str, float] = {}
    with timed(timings, "calibration_data"):
        ids = calibration_ids(model, tokenizer, config)
    return calibrate_on(model, ids, config, gram, timings, scores, score)


def calibrate_on(model: PreTrainedModel, ids: torch.Tensor, config: PruneConfig, gram: bool | None = None,
                 timings: dict[str, float] | None = None, scores: UnitScores | None = None,
                 score: bool = True) -> Calibration:
    """`calibrate` on given token ids (n, T): no tokenizer or data set needed."""
    adapter = get_adapter(model)
    timings = dict(timings or {})
    stats = CalibrationStats()
    scoring = scores is None and score
    scores_from_grams = scoring and config.criterion == "obs"  # the criterion that reads the Grams
    wants_gram = config.compensate != "none" or scores_from_grams or config.compensation_aware
    # Grams one layer at a time, taken while that layer runs: memory does not grow with depth
    grams = LayerGrams(adapter) if (wants_gram if gram is None else gram) else None
    grads: dict[int, torch.Tensor] = {}
    if scoring and config.criterion == "taylor":
        with timed(timings, "importance"):
            grads = accumulate_gradients(adapter, ids, batch_size=config.batch_size)
    context = ScoringContext(adapter, stats, grads, grams)
    layer_scores: list[dict[str, torch.Tensor]] = []
    scoring_s = 0.0
    # taken in the pass only for scoring; compensation's come later, replayed
    grams_now = grams if scores_from_grams else None

    @contextmanager
    def around_layer(layer: int, inputs: LayerInputs) -> Iterator[None]:
        """Layer `layer` runs over the calibration set inside: its Grams and statistics are then
        complete, so its units are scored at once, with no replay of the layer (`engine/capture.py`)."""
        nonlocal scoring_s
        with grams_now.accumulating(layer, inputs.hidden[layer]) if grams_now is not None else nullcontext():
            yield
        if scoring:
            start = time.perf_counter()
            layer_scores.append(score_layer(context, config.criterion, layer))
            scoring_s += time.perf_counter() - start

    with timed(timings, "capture"):
        inputs = capture_layer_inputs(adapter, ids, batch_size=config.batch_size, observers=stats_observers(adapter, stats),
                                      around_layer=around_layer)
    if grams is not None:
        grams.inputs = inputs  # later readers (compensation) replay layers from the cached inputs
        grams.release()  # the last layer's Grams (1.3 GB on a 14,336-wide MLP) are not needed while profiling
    if scoring:  # scored inside the capture pass: its time moves from capture to importance
        timings["capture"] = round(timings["capture"] - scoring_s, 3)
        timings["importance"] = round(timings.get("importance", 0.0) + scoring_s, 3)
        PEAK_RSS_AFTER["importance"] = PEAK_RSS_AFTER["capture"]  # one pass: the same peak
        scores = UnitScores(criterion=config.criterion, scores=layer_scores)
    profile_inputs = inputs.first(config.profile_samples)
    return Calibration(adapter, ids, inputs, stats, scores, profile_inputs, grams, timings)
