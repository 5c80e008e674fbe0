"""Wall-clock timing of a callable: warm-up runs first, then repetitions; CUDA work is waited for.

One definition for `gapprune bench` and the benchmarks, so every reported time means the same thing.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def synchronize(device: torch.device | str | None) -> None:
    """Wait for queued CUDA work on `device`, so the clock measures the work and not its launch."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def timed_runs(fn: Callable[[], object], *, warmup: int = 1, repeats: int = 3,
               device: torch.device | str | None = None) -> list[float]:
    """Seconds of each of `repeats` calls of `fn`, after `warmup` untimed calls."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def median_seconds(fn: Callable[[], object], *, warmup: int = 1, repeats: int = 3,
                   device: torch.device | str | None = None) -> float:
    """Median of `timed_runs`: robust to one slow repetition on a shared machine."""
    return statistics.median(timed_runs(fn, warmup=warmup, repeats=repeats, device=device))
