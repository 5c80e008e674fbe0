"""ΔL on a prefix of the profiling windows, each entry replaying only the windows it was not measured on.

The auto profiler measures an entry on more and more of the profiling windows: the screen's first
window, the ladder's rungs (two, four), then all of them (the exact value). Each ΔL is S/P − B/P (the
replay's and the dense replay's metric sums over P positions), and S, B and P add over windows, so ΔL
on windows 0...w is the position-weighted mean of ΔL on 0...v and on v...w, each against the dense
replay of its own windows: the same value up to float rounding, with only windows v...w replayed. An
exact round thus costs 7/8 of a replay per screened entry at the defaults (one window of eight).

A bf16 screen (`--screen-precision`) counts as a rough first window: the rungs build on it like on a
float32 one, since they are estimates, but an exact value swaps the rough window's share for its
float32 replay, so every exact value is the float32 metric on all windows. A table without the
screen's record (`screen_windows` in its meta) starts at 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from gapprune.allocate.table import LossTable
from gapprune.engine.capture import LayerInputs
from gapprune.engine.head import HeadReference, dense_reference
from gapprune.engine.replay import Entries, Measured, dense_base, positions
from gapprune.models.adapter import ModelAdapter
from gapprune.profiling.loss_table import calibration_tokens, option_grid

Replay = Callable[[LayerInputs, Entries, HeadReference, float], Measured]  # measure_entries on some windows
Key = tuple[int, str, int]  # (layer, component, option index)


@dataclass(frozen=True)
class Known:
    """ΔL of one entry on the first `windows` windows; the first `rough` of them were replayed in bf16,
    where they gave `rough_value` (the rest in float32)."""

    windows: int
    value: float
    rough: int = 0
    rough_value: float = 0.0


@dataclass
class _Windows:
    inputs: LayerInputs
    reference: HeadReference
    base: float


class PrefixReplays:
    """Per entry the windows measured so far and ΔL on them; `measure` extends entries to more windows."""

    def __init__(self, adapter: ModelAdapter, inputs: LayerInputs, metric: str, device: torch.device,
                 known: dict[Key, Known] | None = None) -> None:
        self.adapter, self.inputs, self.metric, self.device = adapter, inputs, metric, device
        self.known = dict(known or {})
        self._windows: dict[tuple[int, int], _Windows] = {}

    @classmethod
    def from_screen(cls, table: LossTable, adapter: ModelAdapter, inputs: LayerInputs, metric: str,
                    device: torch.device) -> PrefixReplays:
        """Starting from `table`'s screen (a screen, or a table an earlier call completed from one)
        where it replayed a prefix of `inputs`; from nothing otherwise."""
        return cls(adapter, inputs, metric, device, screened_values(table, adapter, inputs))

    def windows_of(self, start: int, stop: int) -> _Windows:
        if (start, stop) not in self._windows:
            part = self.inputs.windows(start, stop)
            reference = dense_reference(self.adapter, part, self.metric, self.device)
            self._windows[start, stop] = _Windows(part, reference,
                                                  dense_base(self.adapter, part, reference, self.metric, self.device))
        return self._windows[start, stop]

    def positions_of(self, windows: int) -> int:
        return positions(self.inputs.first(windows), self.metric) if windows else 0

    def measure(self, entries: Entries, windows: int, replay: Replay) -> Measured:
        """ΔL of `entries` on the first `windows` windows: `replay` runs only the windows each one lacks
        (an entry already measured on as many or more keeps its value) and, for an exact value (all
        windows), the rough windows again in float32."""
        exact = windows == self.inputs.n_windows
        missing = {key: self._missing(key, windows, exact) for key in _keys(entries)}
        spans: dict[tuple[int, int], Entries] = {}  # windows start...stop to replay -> the entries lacking them
        for (layer, c, k), needed in missing.items():
            for span in needed:
                spans.setdefault(span, {}).setdefault(layer, {}).setdefault(c, []).append(k)
        replayed: dict[tuple[int, int], Measured] = {}
        for (start, stop), todo in sorted(spans.items()):
            part = self.windows_of(start, stop)
            replayed[start, stop] = replay(part.inputs, todo, part.reference, part.base)
        out: Measured = {}
        for (layer, c, k), needed in missing.items():
            out.setdefault(layer, {}).setdefault(c, {})[k] = self._value((layer, c, k), windows, exact, needed, replayed)
        return out

    def _missing(self, key: Key, windows: int, exact: bool) -> list[tuple[int, int]]:
        if not key[2]:  # nothing removed: ΔL 0 by definition
            return []
        known = self.known.get(key, Known(0, 0.0))
        have = min(known.windows, windows)
        if not (exact and known.rough):
            return [(have, windows)] if have < windows else []
        if have == known.rough:  # only the rough windows known: one float32 replay of all
            return [(0, windows)]
        return [(0, known.rough)] + ([(have, windows)] if have < windows else [])

    def _value(self, key: Key, windows: int, exact: bool, spans: list[tuple[int, int]],
               replayed: dict[tuple[int, int], Measured]) -> float:
        """ΔL on the first `windows` windows: the known part and each replayed span's ΔL, weighted by positions."""
        layer, c, k = key
        if not k:  # nothing removed: ΔL 0 by definition
            return 0.0
        known = self.known.get(key, Known(0, 0.0))
        if not spans:
            return known.value
        whole = spans[0] == (0, windows)  # every window replayed now: nothing known is used
        summed = 0.0 if whole else self.positions_of(min(known.windows, windows)) * known.value
        for start, stop in spans:
            summed += (self.positions_of(stop) - self.positions_of(start)) * replayed[start, stop][layer][c][k]
        if exact and known.rough and not whole:  # the rough windows' share is replaced by their float32 replay
            summed -= self.positions_of(known.rough) * known.rough_value
        return summed / self.positions_of(windows)

    def learn(self, values: Measured, windows: int) -> None:
        """Record ΔL on the first `windows` windows (this rank's or, gathered, another's); on all of them
        it is exact, so no window of it is rough any more."""
        exact = windows == self.inputs.n_windows
        for layer, per in values.items():
            for c, ks in per.items():
                for k, value in ks.items():
                    known = self.known.get((layer, c, k), Known(0, 0.0))
                    if k and (known.windows < windows or exact and known.rough):
                        self.known[layer, c, k] = (Known(windows, value) if exact else
                                                   Known(windows, value, known.rough, known.rough_value))


def _keys(entries: Entries) -> list[Key]:
    return [(layer, c, k) for layer, per in entries.items() for c, ks in per.items() for k in ks]


def screened_values(table: LossTable, adapter: ModelAdapter, inputs: LayerInputs) -> dict[Key, Known]:
    """The screen's ΔL per entry it replayed (interpolated columns excluded), with its window count, rough
    where the screen ran in bf16; empty when the screen does not stand for a prefix of `inputs`."""
    meta = table.meta
    windows = meta.get("screen_windows")
    if not windows or windows >= inputs.n_windows:
        return {}
    if meta.get("tokens") != calibration_tokens(inputs.first(windows)):
        return {}
    saved = meta.get("auto", {})
    if meta.get("profiler") == "screen":
        raw = table.loss
    elif saved.get("estimate_profiler") == "screen" and "estimate" in saved:
        raw = {c: np.asarray(v, dtype=np.float64) for c, v in saved["estimate"].items()}
    else:
        return {}
    grid = option_grid(adapter, meta["channel_step"], meta.get("mlp_stride", 1)).thinned(meta.get("thin", 1))
    rough = windows if meta.get("precision") != "float32" else 0
    known = {(layer, c, k): Known(windows, value, rough, value if rough else 0.0)
             for c, ks in grid.measured.items() for k in ks if k for layer in range(adapter.n_layers)
             for value in (float(raw[c][layer, k]),)}
    return known | rung_values(saved, known, inputs.n_windows)


def rung_values(saved: dict[str, Any], screened: dict[Key, Known], n_windows: int) -> dict[Key, Known]:
    """ΔL on the highest rung each entry reached in an earlier call of the auto profiler (`meta["auto"]`),
    built on the screen's windows as that call's were (rough where those are), so a later call climbs on
    from there instead of replaying the rung's windows again."""
    windows = saved.get("ladder", {}).get("windows", [])
    out: dict[Key, Known] = {}
    for c, rungs in saved.get("rung", {}).items():
        reached, values = np.asarray(rungs, dtype=np.int64), np.asarray(saved["on_rung"][c], dtype=np.float64)
        for layer, k in zip(*np.nonzero(reached >= 0), strict=True):
            rung, key = int(reached[layer, k]), (int(layer), c, int(k))
            if k and windows[rung] < n_windows and not np.isnan(values[layer, k, rung]):
                below = screened.get(key, Known(0, 0.0))
                out[key] = Known(windows[rung], float(values[layer, k, rung]), below.rough, below.rough_value)
    return out
