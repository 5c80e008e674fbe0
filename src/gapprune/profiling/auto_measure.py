"""The `auto` profiler's measurement from a live `Calibration`: the screen (a cheap estimate of every entry),
then exact replays of what can change the budget's plan, by the rule of `auto.py` (numbers only), with the
ladder of window counts and a checkpoint per round."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gapprune.allocate import LossTable
from gapprune.config import TABLE_SETTINGS, PruneConfig
from gapprune.distributed import all_gather, gather_table, rank, shard_entries, shard_layers, world_size
from gapprune.engine.replay import (
    Entries,
    Measured,
    measure_entries,
    resolve_precision,
)
from gapprune.models import ModelAdapter
from gapprune.models.loading import default_cache_dir
from gapprune.models.streaming import is_streamed
from gapprune.profiling.auto import Ladder, Solve, auto_table
from gapprune.profiling.batched import build_loss_table_batched
from gapprune.profiling.checkpoint import EntryCheckpoint, run_key
from gapprune.profiling.loss_table import calibration_tokens, option_grid, units_of
from gapprune.profiling.prefix_replays import PrefixReplays

if TYPE_CHECKING:
    from gapprune.engine.capture import LayerInputs
    from gapprune.engine.head import HeadReference
    from gapprune.profiling.calibration import Calibration

from gapprune.profiling.exact import measure_exact, step_of, table_compensation

log = logging.getLogger(__name__)


def screen_stride_of(adapter: ModelAdapter, config: PruneConfig) -> int:
    """The configured screen stride, else 2 for a decoder of a billion parameters or more, else 1.

    Half the columns take half the screen's time at any size (SmolLM2-135M: 58 vs 106 s), but what
    that buys differs: on Qwen2.5-Coder-1.5B 4.5 of 49 minutes at an unchanged plan (summed exact
    ΔL −0.09%), on SmolLM2 48 s of 6 minutes at +1.2% summed ΔL (`docs/performance.md` §8).
    """
    return config.screen_stride or (2 if adapter.decoder_params() >= 1_000_000_000 else 1)


def measure_auto(calibration: Calibration, config: PruneConfig, checkpoint_dir: Path | None = None,
                 solve: Solve | None = None) -> LossTable:
    """`auto`: the screen, then exact replays of what can change `solve`'s plan (`complete_table`);
    without `solve` it stops at the estimate, and `complete_table` finishes it for a budget later."""
    if is_streamed(calibration.adapter.model):  # a replay of a streamed model reads every later layer from disk again
        log.info("auto profiler on a streamed model: measuring the whole exact table, one pass over the weights")
        return measure_exact(calibration, config, checkpoint_dir, solve)
    checkpoint = auto_checkpoint(calibration, config, checkpoint_dir)
    saved = checkpoint.load_screen()
    if saved is not None:
        log.info("resuming the auto profiler from its saved screen")
    estimate = LossTable.from_dict(saved) if saved is not None else screen_table(calibration, config)
    checkpoint.save_screen(estimate.to_dict())
    if solve is None:
        checkpoint.clear()
        return estimate
    return complete_table(calibration, estimate, config, solve, checkpoint_dir)


def screen_table(calibration: Calibration, config: PruneConfig, inputs: LayerInputs | None = None) -> LossTable:
    """The auto profiler's estimate: the exact metric on the first `screen_samples` profiling windows.

    Same replays and metric as the exact table, on a fraction of its tokens (128 of 1,024 by
    default) and of its options (every `screen_stride`-th column of its grid, the rest interpolated:
    ~5% of its time), in `screen_precision` (in bf16 the head's product too, of the difference from the
    dense state: `engine.head.RoughHead`; the metric's sums in float32), so it is valid wherever
    the exact table is (unlike a second-order estimate, which misses e.g. Gemma's whole-sub-block
    options). No entry is exact; the exact rounds may measure any column of the exact grid.
    `inputs`: other layer inputs to screen on (a study of screens), instead of the profiling prefix;
    only a screen of the prefix records `screen_windows`, which lets the exact rounds reuse it.
    """
    adapter = calibration.adapter
    layers = shard_layers(adapter.n_layers)
    prefix = inputs is None
    inputs = inputs if inputs is not None else calibration.profile_inputs.first(config.screen_samples)
    table = build_loss_table_batched(adapter, inputs,
                                     calibration.unit_scores, metric=config.metric, channel_step=step_of(adapter, config),
                                     mlp_stride=config.mlp_stride, layers=layers,
                                     desc=f"auto: screening ({sum(len(h) for h in inputs.final_hidden)} window(s))",
                                     compensation=table_compensation(calibration, config),
                                     thin=screen_stride_of(adapter, config), precision=screen_precision_of(adapter, config))
    table = gather_table(table, layers)
    assert table.exact is not None
    for c in table.exact:
        table.exact[c][:] = False
    table.meta["profiler"] = "screen"
    if prefix:
        table.meta["screen_windows"] = inputs.n_windows
    return table


def screen_precision_of(adapter: ModelAdapter, config: PruneConfig) -> str:
    """The screen's precision; `auto` resolves to bf16 where it is fast (a GPU, a CPU with AMX)."""
    return resolve_precision(config.screen_precision, next(adapter.model.parameters()).device)


def auto_checkpoint(calibration: Calibration, config: PruneConfig, checkpoint_dir: Path | None) -> EntryCheckpoint:
    """Where the auto profiler keeps its screen and measured entries while it runs (keyed like the exact table)."""
    precision = screen_precision_of(calibration.adapter, config)
    key = run_key({"fingerprint": calibration.fingerprint(config, TABLE_SETTINGS), "auto": True,
                   "screen_samples": config.screen_samples,
                   "screen_stride": screen_stride_of(calibration.adapter, config),
                   # named only when not float32, so a run killed before the option existed still resumes
                   **({"screen_precision": precision} if precision != "float32" else {}),
                   "profile_tokens": calibration_tokens(calibration.profile_inputs),
                   # under torchrun every rank keeps its own: one rank clearing a finished run must not
                   # remove the folder another rank is still writing to
                   **({"rank": rank(), "world_size": world_size()} if world_size() > 1 else {})})
    return EntryCheckpoint(checkpoint_dir or default_cache_dir() / "tables", key)


def complete_table(calibration: Calibration, table: LossTable, config: PruneConfig, solve: Solve,
                   checkpoint_dir: Path | None = None) -> LossTable:
    """Measure exactly the entries of `table` that can change the plan `solve` makes of it (`auto`):
    GAP's plan under whatever budget `solve` holds (a ratio, a parameter count, a speedup, a memory size).

    Starts from the estimates in `table` (the screen, Fisher, or a table completed for another ratio,
    whose exact entries are kept) and measures, on the exact profiler's option grid, every entry that a
    margin test says could beat a pick, until every pick is exact and no estimate can beat it.
    """
    if not table.measured:
        raise ValueError("this profile holds parameter costs only (profiled for a baseline allocator); "
                         "profile again for the gap allocator")
    adapter, scores, inputs = calibration.adapter, calibration.unit_scores, calibration.profile_inputs
    device = next(adapter.model.parameters()).device

    compensation = table_compensation(calibration, config)
    kept = units_of(adapter, scores, table.options)
    prefixes = PrefixReplays.from_screen(table, adapter, inputs, config.metric, device)  # the screen's windows count

    checkpoint = auto_checkpoint(calibration, config, checkpoint_dir)
    saved = checkpoint.load_entries()  # entries a killed run measured: its rounds replay without replays
    for part in all_gather(saved)[1:] if world_size() > 1 else []:  # a stop may have caught the ranks' writes apart:
        for layer, row in part.items():  # every rank resumes from all of them, so all split the same rounds
            for c, values in row.items():
                saved.setdefault(layer, {}).setdefault(c, {}).update(values)
    per_rank: list[list[int]] = []  # entries each rank replayed, per call

    def replayed(entries: Entries, windows: int, desc: str) -> Measured:
        """ΔL of `entries` on the first `windows` windows: this rank replays its share, every rank gets all."""
        counts = [sum(len(ks) for ks in per.values()) for per in entries.values()]
        mine = {layer: entries[layer] for layer in shard_entries(list(entries), counts, adapter.n_layers)}

        def replay(part: LayerInputs, todo: Entries, reference: HeadReference, base: float) -> Measured:
            return measure_entries(adapter, part, todo, kept, metric=config.metric, reference=reference, base=base,
                                   desc=desc, compensation=compensation)

        fresh = prefixes.measure(mine, windows, replay) if mine else {}
        parts = all_gather(fresh)  # every rank holds every value, so every rank solves the same next round
        per_rank.append([sum(len(values) for row in part.values() for values in row.values()) for part in parts])
        fresh = {layer: row for part in parts for layer, row in part.items()}
        prefixes.learn(fresh, windows)
        return fresh

    def measure(entries: Entries) -> Measured:  # a bar per round: replays of this round's candidates
        todo = {layer: {c: [k for k in ks if k not in saved.get(layer, {}).get(c, {})] for c, ks in per.items()}
                for layer, per in entries.items()}
        todo = {layer: {c: ks for c, ks in per.items() if ks} for layer, per in todo.items()}
        todo = {layer: per for layer, per in todo.items() if per}
        fresh = replayed(todo, inputs.n_windows, "auto: exact replays this round") if todo else {}
        if fresh:
            checkpoint.save_round(fresh)
        for layer, per in fresh.items():
            for c, values in per.items():
                saved.setdefault(layer, {}).setdefault(c, {}).update(values)
        return {layer: {c: {k: saved[layer][c][k] for k in ks} for c, ks in per.items()} for layer, per in entries.items()}

    def climb(entries: Entries, windows: int) -> Measured:
        return replayed(entries, windows, f"auto: replays on {windows} windows this round")

    grid = option_grid(adapter, table.meta.get("channel_step") or step_of(adapter, config), config.mlp_stride)
    completed = auto_table(table, measure, solve, columns=grid.measured, margin=config.auto_margin,
                           ladder=ladder_of(config, inputs.n_windows, climb))
    if world_size() > 1:
        completed.meta["auto"]["rank_entries"] = per_rank
    checkpoint.clear()
    return completed


def ladder_of(config: PruneConfig, n_windows: int, climb: Callable[[Entries, int], Measured]) -> Ladder | None:
    """The auto profiler's rungs: the screen's windows doubled while fewer than all (1 -> 2, 4 of 8 at
    the defaults), each rung's margin the screen's scaled by how far a mean over its windows can be
    from the mean over all of them (sampling without replacement: √(1/w − 1/n) against the screen's).

    Simulated on SmolLM2-135M's per-window exact table (docs/auto_profiler.md, "The ladder"): against
    measuring every screened candidate exactly, fewer replays at 12.5-25% and plans nearer the exact
    optimum at every ratio.
    """
    first = config.screen_samples
    rungs: list[int] = []
    while first * 2 ** (len(rungs) + 1) < n_windows:
        rungs.append(first * 2 ** (len(rungs) + 1))
    if not rungs:
        return None
    spread = math.sqrt(1 / first - 1 / n_windows)
    return Ladder(climb, tuple(rungs), tuple(config.auto_margin * math.sqrt(1 / w - 1 / n_windows) / spread
                                             for w in rungs))
