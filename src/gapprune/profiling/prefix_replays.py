"""ΔL on a prefix of the profiling windows, each entry replaying only the windows it was not measured on.

The auto profiler measures an entry on more and more of the profiling windows: the screen's first
window, the ladder's rungs (two, four), then all of them (the exact value). Each ΔL is S/P − B/P (the
replay's and the dense replay's metric sums over P positions), and S, B and P add over windows, so ΔL
on windows 0...w is the position-weighted mean of ΔL on 0...v and on v...w, each against the dense
replay of its own windows: the same value up to float rounding, with only windows v...w replayed. An
exact round thus costs 7/8 of a replay per screened entry at the defaults (one window of eight).

A screen counts only if it replayed the profiling prefix in float32 (a bf16 screen's values are not
the exact metric's); a table without the screen's record (`screen_windows` in its meta) starts at 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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


@dataclass
class _Windows:
    inputs: LayerInputs
    reference: HeadReference
    base: float


class PrefixReplays:
    """Per entry the windows measured so far and ΔL on them; `measure` extends entries to more windows."""

    def __init__(self, adapter: ModelAdapter, inputs: LayerInputs, metric: str, device: torch.device,
                 known: dict[Key, tuple[int, float]] | None = None) -> None:
        self.adapter, self.inputs, self.metric, self.device = adapter, inputs, metric, device
        self.known = dict(known or {})  # (layer, c, k) -> (windows measured, ΔL on them)
        self._windows: dict[tuple[int, int], _Windows] = {}

    @classmethod
    def from_screen(cls, table: LossTable, adapter: ModelAdapter, inputs: LayerInputs, metric: str,
                    device: torch.device) -> PrefixReplays:
        """Starting from `table`'s screen (a screen, or a table an earlier call completed from one)
        where it replayed a prefix of `inputs` in float32; from nothing otherwise."""
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
        (an entry already measured on as many or more keeps its value)."""
        by_start: dict[int, Entries] = {}
        for layer, c, k in _keys(entries):
            start = min(self.known.get((layer, c, k), (0, 0.0))[0], windows) if k else windows
            by_start.setdefault(start, {}).setdefault(layer, {}).setdefault(c, []).append(k)
        total = self.positions_of(windows)
        out: Measured = {}
        for start, todo in sorted(by_start.items()):
            if start < windows:
                part = self.windows_of(start, windows)
                rest = replay(part.inputs, todo, part.reference, part.base)
            before = self.positions_of(start)
            for layer, c, k in _keys(todo):
                if not k:  # nothing removed: ΔL 0 by definition
                    value = 0.0
                elif start == windows:
                    value = self.known[layer, c, k][1]
                else:
                    earlier = self.known[layer, c, k][1] if start else 0.0
                    value = (before * earlier + (total - before) * rest[layer][c][k]) / total
                out.setdefault(layer, {}).setdefault(c, {})[k] = value
        return out

    def learn(self, values: Measured, windows: int) -> None:
        """Record ΔL on the first `windows` windows (this rank's or, gathered, another's)."""
        for layer, per in values.items():
            for c, ks in per.items():
                for k, value in ks.items():
                    if k and self.known.get((layer, c, k), (0, 0.0))[0] < windows:
                        self.known[layer, c, k] = (windows, value)


def _keys(entries: Entries) -> list[Key]:
    return [(layer, c, k) for layer, per in entries.items() for c, ks in per.items() for k in ks]


def screened_values(table: LossTable, adapter: ModelAdapter, inputs: LayerInputs) -> dict[Key, tuple[int, float]]:
    """The screen's ΔL per entry it replayed (interpolated columns excluded), with its window count;
    empty when the screen does not stand for a prefix of `inputs` in float32."""
    meta = table.meta
    windows = meta.get("screen_windows")
    if not windows or meta.get("precision") != "float32" or windows >= inputs.n_windows:
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
    return {(layer, c, k): (windows, float(raw[c][layer, k]))
            for c, ks in grid.measured.items() for k in ks if k for layer in range(adapter.n_layers)}
