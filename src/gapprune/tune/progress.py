"""The training loops' progress bar: steps when a step count ends the run, seconds when a time budget does."""

from __future__ import annotations

from tqdm.auto import tqdm

_TIMED_BAR = "{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s [{elapsed}<{remaining}{postfix}]"


def training_bar(desc: str, *, total_steps: int, step: int, max_seconds: float, seconds_done: float) -> tqdm:
    """A bar whose estimate is the run's real end: with a time budget, 100000 nominal steps would promise days."""
    if max_seconds:
        initial = min(seconds_done, max_seconds)
        return tqdm(total=max_seconds, initial=initial, desc=desc, unit="s", bar_format=_TIMED_BAR)
    return tqdm(total=total_steps, initial=step, desc=desc, unit="step")


def advance(bar: tqdm, *, max_seconds: float, seconds_done: float) -> None:
    """Move the bar by one step, or to the training seconds spent so far.

    Seconds stop at the budget: the last step ends past it, and tqdm drops `total` from its format
    fields once `n` exceeds it, which the timed format cannot print.
    """
    bar.update(min(seconds_done, bar.total) - bar.n if max_seconds else 1)
