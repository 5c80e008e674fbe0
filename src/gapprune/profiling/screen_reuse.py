"""The screen's windows, reused by the auto profiler's exact rounds.

The screen (`tables.screen_table`) is the exact metric on the first `screen_samples` profiling
windows, so an exact replay of an option the screen replayed needs only the other windows. Each
ΔL is S/P − B/P (the replay's and the dense replay's metric sums over P positions), and S, B and P
add over windows, so ΔL on all windows is the position-weighted mean of the screen's ΔL and the
rest's, each against the dense replay of its own windows: the same value up to float rounding, for
7/8 of the replay at the defaults (one screened window of eight).

Only a screen that replayed these windows in float32 qualifies (a bf16 screen's values are not the
exact metric's); a table without the screen's record (`screen_windows` in its meta) is measured whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from gapprune.allocate.table import LossTable
from gapprune.engine.capture import LayerInputs
from gapprune.engine.head import HeadReference, dense_reference
from gapprune.engine.replay import Entries, Measured, dense_base, positions
from gapprune.models.adapter import ModelAdapter
from gapprune.profiling.loss_table import calibration_tokens, option_grid


@dataclass
class ScreenReuse:
    """The screen's values and what a replay of the windows after its own needs."""

    values: Measured  # the screen's ΔL of every entry it replayed (interpolated columns excluded)
    screen_positions: int
    rest: LayerInputs  # the profiling windows after the screen's
    rest_positions: int
    reference: HeadReference  # the dense side of the metric on `rest`
    base: float  # the dense replay's metric on `rest`

    @classmethod
    def prepare(cls, table: LossTable, adapter: ModelAdapter, inputs: LayerInputs, metric: str,
                device: torch.device) -> ScreenReuse | None:
        """Reuse for `table` (a screen, or a table an earlier call completed from one) measured on a
        prefix of `inputs`; None when its values cannot stand for those windows."""
        meta = table.meta
        windows = meta.get("screen_windows")
        if not windows or meta.get("precision") != "float32" or windows >= inputs.n_windows:
            return None
        screen_inputs = inputs.first(windows)
        if meta.get("tokens") != calibration_tokens(screen_inputs):
            return None
        saved = meta.get("auto", {})
        if meta.get("profiler") == "screen":
            raw = table.loss
        elif saved.get("estimate_profiler") == "screen" and "estimate" in saved:
            raw = {c: np.asarray(v, dtype=np.float64) for c, v in saved["estimate"].items()}
        else:
            return None
        grid = option_grid(adapter, meta["channel_step"], meta.get("mlp_stride", 1)).thinned(meta.get("thin", 1))
        values: Measured = {layer: {c: {k: float(raw[c][layer, k]) for k in ks if k} for c, ks in grid.measured.items()}
                            for layer in range(adapter.n_layers)}
        rest = inputs.windows(windows, inputs.n_windows)
        reference = dense_reference(adapter, rest, metric, device)
        return cls(values, positions(screen_inputs, metric), rest, positions(rest, metric), reference,
                   dense_base(adapter, rest, reference, metric, device))

    def split(self, entries: Entries) -> tuple[Entries, Entries]:
        """(the entries the screen replayed, the others), each `{layer: {component: [k, ...]}}`."""
        screened: Entries = {}
        whole: Entries = {}
        for layer, per in entries.items():
            for c, ks in per.items():
                known = self.values.get(layer, {}).get(c, {})
                for k in ks:
                    (screened if k in known else whole).setdefault(layer, {}).setdefault(c, []).append(k)
        return screened, whole

    def combine(self, rest: Measured) -> Measured:
        """ΔL on all profiling windows from the rest's ΔL and the screen's, weighted by positions."""
        total = self.screen_positions + self.rest_positions
        return {layer: {c: {k: (self.screen_positions * self.values[layer][c][k] + self.rest_positions * value) / total
                            if k else 0.0 for k, value in values.items()}
                        for c, values in per.items()}
                for layer, per in rest.items()}
