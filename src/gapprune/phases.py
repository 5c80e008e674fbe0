"""Named phase timings that every stage adds to, so a run can report where its time went."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from tqdm.auto import tqdm

log = logging.getLogger(__name__)
T = TypeVar("T")


@contextmanager
def timed(timings: dict[str, float], phase: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    timings[phase] = round(timings.get(phase, 0.0) + time.perf_counter() - start, 3)
    log.info("%s took %.1f s", phase, timings[phase])


def layer_progress(items: Iterable[T], n_layers: int, width: int, desc: str) -> Iterable[T]:
    """`items` with a per-layer progress bar when the model is big enough for a layer to take
    seconds (n_layers × MLP width ≥ 50,000: SmolLM2 and up); tiny test models stay quiet."""
    return tqdm(items, desc=desc, unit="layer", disable=n_layers * width < 50_000)
