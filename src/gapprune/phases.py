"""Named phase timings that every stage adds to, so a run can report where its time went."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)


@contextmanager
def timed(timings: dict[str, float], phase: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    timings[phase] = round(timings.get(phase, 0.0) + time.perf_counter() - start, 3)
    log.info("%s took %.1f s", phase, timings[phase])
