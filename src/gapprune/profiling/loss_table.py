"""The capability-loss table ΔL[layer, component, option] (DESIGN §3): its option grid, and the
reference profiler that measures it one option at a time.

ΔL is the change of a global metric when only one component of one layer is pruned to one option.
Only layers l...L change, so each entry replays them from the cached inputs of layer l (the
engine). A unit is "removed" by zeroing its columns of the output projection (`engine.masks`):
that equals physical removal exactly (tested), and lets one copy of the model serve every option.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from gapprune.allocate.table import LossTable
from gapprune.components import COMPONENTS
from gapprune.engine.capture import LayerInputs
from gapprune.engine.head import dense_reference
from gapprune.engine.masks import masked_units
from gapprune.engine.metrics import METRICS
from gapprune.engine.replay import KeptUnits, replay_metric
from gapprune.importance.base import UnitScores
from gapprune.models.adapter import ModelAdapter
from gapprune.options import attention_options, kept_units, mlp_options, option_params


def component_options(adapter: ModelAdapter, layer: int, channel_step: int) -> dict[str, list[list[int]]]:
    shape = adapter.layer_shape(layer)
    n_rep = shape.n_heads // shape.n_kv_heads
    return {
        "attn": [[g, q] for g, q in attention_options(shape.n_kv_heads, n_rep)],
        "mlp": [[n] for n in mlp_options(shape.intermediate, channel_step)],
    }


def measured_options(n_options: int, stride: int) -> list[int]:
    """Option indices that are replayed: 0, stride, 2·stride, ..., and always the last."""
    if stride < 1:
        raise ValueError(f"the profiling stride must be >= 1, got {stride}")
    picked = list(range(0, n_options, stride))
    return picked if picked[-1] == n_options - 1 else picked + [n_options - 1]


def units_of(adapter: ModelAdapter, scores: UnitScores, options: dict[str, list[list[int]]]) -> KeptUnits:
    """The engine's view of an option: (layer, component, option index) -> the units it keeps."""

    def kept(layer: int, component: str, k: int) -> list[int]:
        return kept_units(scores, adapter, layer, component, options[component][k])

    return kept


@dataclass
class OptionGrid:
    """The options every layer offers, their parameter costs, and which of them are replayed."""

    options: dict[str, list[list[int]]]
    removed: dict[str, np.ndarray]  # (n_layers, n_options) parameters removed
    measured: dict[str, list[int]]  # option indices replayed; the others are interpolated

    def empty_loss(self) -> dict[str, np.ndarray]:
        return {c: np.zeros(v.shape) for c, v in self.removed.items()}

    def exact_mask(self) -> dict[str, np.ndarray]:
        """(n_layers, n_options) bool per component: True for the replayed options."""
        mask = {c: np.zeros(v.shape, dtype=bool) for c, v in self.removed.items()}
        for c, picked in self.measured.items():
            mask[c][:, picked] = True
        return mask

    def thinned(self, stride: int) -> OptionGrid:
        """The same options with every `stride`-th replayed option kept (and the last): a cheaper grid
        whose other options are interpolated, for a screen whose exact rounds may measure them."""
        measured = {c: [picked[i] for i in measured_options(len(picked), stride)] for c, picked in self.measured.items()}
        return OptionGrid(self.options, self.removed, measured)

    def interpolate_(self, loss: dict[str, np.ndarray], layer: int) -> None:
        """Fill the options that were not replayed, linearly in parameters removed."""
        for c, picked in self.measured.items():
            if len(picked) < len(self.options[c]):
                loss[c][layer] = np.interp(self.removed[c][layer], self.removed[c][layer, picked], loss[c][layer, picked])


def option_grid(adapter: ModelAdapter, channel_step: int, mlp_stride: int = 1) -> OptionGrid:
    options = component_options(adapter, 0, channel_step)
    for layer in range(adapter.n_layers):
        if component_options(adapter, layer, channel_step) != options:
            raise ValueError("profiling needs every layer to have the same shape (start from a dense model)")
    removed = {c: np.zeros((adapter.n_layers, len(options[c])), dtype=np.int64) for c in COMPONENTS}
    for layer in range(adapter.n_layers):
        for c in COMPONENTS:
            full = adapter.component_params(layer, c)
            for k, option in enumerate(options[c]):
                removed[c][layer, k] = full - option_params(adapter, layer, c, option)
    measured = {c: measured_options(len(options[c]), mlp_stride if c == "mlp" else 1) for c in COMPONENTS}
    return OptionGrid(options, removed, measured)


def calibration_tokens(inputs: LayerInputs) -> int:
    return sum(int(h.shape[0] * h.shape[1]) for h in inputs.final_hidden)


@torch.inference_mode()
def build_loss_table(
    adapter: ModelAdapter,
    inputs: LayerInputs,
    scores: UnitScores,
    *,
    metric: str = "kl",
    channel_step: int,
    mlp_stride: int = 1,
    measure: bool = True,
    progress: bool = True,
) -> LossTable:
    """Measure ΔL for every option of every component of every layer: the exact reference profiler.

    One option at a time, full logits: simple and slow; `batched.build_loss_table_batched` gives the
    same table faster and is what the pipeline uses. With `mlp_stride` s > 1 only every s-th MLP
    option (and the last, the removed MLP) is replayed; the options between are interpolated
    linearly in parameters removed. Attention options are always all measured. With
    `measure=False` only the parameter costs are filled (ΔL stays 0): enough for allocators that
    do not read ΔL.
    """
    METRICS.get(metric)  # fail early on an unknown name
    device = next(adapter.model.parameters()).device
    grid = option_grid(adapter, channel_step, mlp_stride)
    loss = grid.empty_loss()
    start_time = time.perf_counter()
    if measure:
        reference = dense_reference(adapter, inputs, metric, device)
        total = adapter.n_layers * sum(len(v) - 1 for v in grid.measured.values())
        bar = tqdm(total=total, desc=f"profile ΔL ({metric})", unit="opt", disable=not progress)
        for layer in range(adapter.n_layers):
            base = replay_metric(adapter, inputs, layer, metric, reference, device)
            for component in COMPONENTS:
                for k in grid.measured[component][1:]:
                    kept = kept_units(scores, adapter, layer, component, grid.options[component][k])
                    with masked_units(adapter, layer, component, kept):
                        value = replay_metric(adapter, inputs, layer, metric, reference, device)
                    loss[component][layer, k] = value - base
                    bar.update()
            grid.interpolate_(loss, layer)
        bar.close()
    meta = {"profiler": "reference", "tokens": calibration_tokens(inputs), "channel_step": channel_step,
            "mlp_stride": mlp_stride, "measured": measure, "wall_s": round(time.perf_counter() - start_time, 2)}
    exact = grid.exact_mask() if measure else {c: np.zeros(v.shape, dtype=bool) for c, v in loss.items()}
    return LossTable(metric=metric, criterion=scores.criterion, options=grid.options, loss=loss, removed=grid.removed,
                     meta=meta, exact=exact, param_unit=adapter.hidden)
