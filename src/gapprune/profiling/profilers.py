"""The profilers that measure the loss table: each one's function, what it supports, and the one
place that refuses the rest.

To add a profiler, write its module (a client of `gapprune.engine`) with a function of the
`Measure` signature and register a `ProfilerSpec` here under the name `--profiler` takes, saying
what it supports. Every refusal of a combination (a profiler on a streamed model, a
compensation-aware table by a profiler that does not replay, settings that need every layer's
weights at once) lives in `check_supported`, so the CLI and the API refuse the same things with the
same words (parameter names, which are the flags' names too), before any work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gapprune.allocate import LossTable
from gapprune.budget import reads_loss
from gapprune.config import PruneConfig
from gapprune.profiling.auto import Solve
from gapprune.profiling.auto_measure import measure_auto
from gapprune.profiling.exact import costs_only, measure_exact, needs_loss_table
from gapprune.profiling.fisher import measure_fisher
from gapprune.registry import Registry

if TYPE_CHECKING:
    from gapprune.profiling.calibration import Calibration

# (calibration, config, checkpoint folder, the budget's solve or None) -> the loss table
Measure = Callable[["Calibration", PruneConfig, Path | None, Solve | None], LossTable]


@dataclass(frozen=True)
class ProfilerSpec:
    """A profiler: the function that measures (`measure`) and what it can do (streamed: runs with
    one decoder layer in memory; compensation_aware: measures options as compensated; ranks: splits
    its work over torchrun ranks)."""

    name: str
    summary: str
    measure: Measure
    streamed: bool
    compensation_aware: bool
    ranks: bool


PROFILERS: Registry[ProfilerSpec] = Registry("profiler")
for _spec in (
    ProfilerSpec("auto", "a screen on the first window(s), then exact replays only where they can change the plan "
                 "(on a streamed model: the whole exact table in one layer-major pass)", measure_auto,
                 streamed=True, compensation_aware=True, ranks=True),
    ProfilerSpec("exact", "replay every option from the cached layer inputs (checkpointed per layer)", measure_exact,
                 streamed=True, compensation_aware=True, ranks=True),
    ProfilerSpec("fisher", "a second-order estimate from gradients of every layer at once", measure_fisher,
                 streamed=False, compensation_aware=False, ranks=False),
):
    PROFILERS.register(_spec.name)(_spec)


def measure_table(calibration: Calibration, config: PruneConfig, checkpoint_dir: Path | None = None,
                  solve: Solve | None = None) -> LossTable:
    """The loss table by the configured profiler (GAP), or the parameter costs alone (a baseline).

    `auto` completes its table for `solve` (a budget's plan of a table); without one it stops at the
    estimate, and `tables.complete_table` finishes it for a budget later.
    """
    if not needs_loss_table(config):
        return costs_only(calibration, config)
    return PROFILERS.get(config.profiler).measure(calibration, config, checkpoint_dir, solve)


def check_supported(config: Any, *, streamed: bool, plan_given: bool = False) -> None:
    """Refuse, naming the way out, a combination of settings that cannot run (`config`: a PruneConfig).

    `streamed`: the decoder layers are read from disk one at a time (`--offload`); `plan_given`: a
    plan is applied as it is, so nothing is profiled.
    """
    spec = PROFILERS.get(config.profiler)
    profiles = not plan_given and reads_loss(config.allocator)
    if config.compensation_aware and not spec.compensation_aware:
        supported = " or ".join(name for name in PROFILERS if PROFILERS.get(name).compensation_aware)
        raise ValueError(f"the compensation-aware table is measured by replays: set profiler to {supported} "
                         f"instead of {spec.name}")
    if not streamed:
        return
    if profiles and not spec.streamed:
        supported = " or ".join(name for name in PROFILERS if PROFILERS.get(name).streamed)
        raise ValueError(f"a streamed model (offload) is profiled by the exact layer-major profiler; "
                         f"set profiler to {supported} instead of {spec.name}")
    if config.compensation_aware:
        raise ValueError("compensation_aware is not supported with a streamed model yet; load it in memory "
                         "(offload off)")
    if config.criterion == "taylor":
        raise ValueError("the taylor criterion needs gradients of every layer at once; on a streamed model "
                         "(offload) set criterion to obs, activation, fluctuation or magnitude")
    if config.refine:
        raise ValueError("refine masks several layers at once; it does not run on a streamed model (offload)")
