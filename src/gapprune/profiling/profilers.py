"""The profilers that measure the loss table, what each supports, and the one place that refuses the rest.

To add a profiler, register a `ProfilerSpec` under the name `--profiler` takes, say what it
supports, and give `profiling/tables.py` its branch. Every refusal of a combination (a profiler on a
streamed model, a compensation-aware table by a profiler that does not replay, settings that need
every layer's weights at once) lives in `check_supported`, so the CLI and the API refuse the same
things with the same words (parameter names, which are the flags' names too), before any work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gapprune.registry import Registry


@dataclass(frozen=True)
class ProfilerSpec:
    """What a profiler can do (streamed: runs with one decoder layer in memory; compensation_aware:
    measures options as compensated; ranks: splits its work over torchrun ranks)."""

    name: str
    summary: str
    streamed: bool
    compensation_aware: bool
    ranks: bool


PROFILERS: Registry[ProfilerSpec] = Registry("profiler")
for _spec in (
    ProfilerSpec("auto", "a screen on the first window(s), then exact replays only where they can change the plan "
                 "(on a streamed model: the whole exact table in one layer-major pass)", streamed=True,
                 compensation_aware=True, ranks=True),
    ProfilerSpec("exact", "replay every option from the cached layer inputs (checkpointed per layer)", streamed=True,
                 compensation_aware=True, ranks=True),
    ProfilerSpec("fisher", "a second-order estimate from gradients of every layer at once", streamed=False,
                 compensation_aware=False, ranks=False),
):
    PROFILERS.register(_spec.name)(_spec)


def check_supported(config: Any, *, streamed: bool, plan_given: bool = False) -> None:
    """Refuse, naming the way out, a combination of settings that cannot run (`config`: a PruneConfig).

    `streamed`: the decoder layers are read from disk one at a time (`--offload`); `plan_given`: a
    plan is applied as it is, so nothing is profiled.
    """
    spec = PROFILERS.get(config.profiler)
    profiles = not plan_given and config.allocator == "gap"
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
