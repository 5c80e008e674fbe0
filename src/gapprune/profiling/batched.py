"""The exact ΔL profiler, fast: the same table as the reference `build_loss_table`, in fewer, larger passes.

What changes against the reference (and nothing else, so the table agrees to float tolerance):
* several options of one component run as one stacked batch: the cached input of layer l is
  repeated once per option and a pre-hook on the component's output projection multiplies each
  copy's input by that option's unit mask (equal to zeroing the weight columns, tested);
* the dense replay (the ΔL zero point) is measured once, from the last layer (`dense_base`);
* the metric needs no vocabulary-sized dense reference and no full logits tensor (`head.py`):
  the LM head and logsumexp run in row chunks, the dense side is cached hidden-sized;
* optionally the replay runs under bf16 autocast (`precision="bfloat16"`, for GPUs; check the
  ranking against float32 before trusting it, see docs/performance.md).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from gapprune.calibrate.capture import LayerInputs, move_kwargs, run_layer
from gapprune.components import COMPONENTS
from gapprune.importance.base import UnitScores
from gapprune.models.adapter import ModelAdapter
from gapprune.options import kept_units
from gapprune.profiling.head import HeadReference, dense_reference, metric_sums
from gapprune.profiling.loss_table import LossTable, OptionGrid, calibration_tokens, option_grid
from gapprune.profiling.metrics import METRICS


def stack_kwargs(kwargs: dict[str, Any], batch: int, copies: int) -> dict[str, Any]:
    """Repeat every per-sample tensor (leading dim == batch) `copies` times; broadcast ones stay."""

    def expand(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.ndim >= 2 and value.shape[0] == batch and batch > 1:
            return value.repeat(copies, *([1] * (value.ndim - 1)))
        if isinstance(value, tuple):
            return tuple(expand(v) for v in value)
        return value

    return {k: expand(v) for k, v in kwargs.items()}


Compensated = tuple[torch.Tensor, torch.Tensor]  # an output projection's full-width weight and bias
Compensation = Callable[[int, str, list[int]], Compensated | None]  # (layer, component, kept units) -> refit


@contextlib.contextmanager
def option_masks(adapter: ModelAdapter, layer: int, component: str, kept: list[list[int] | None],
                 compensated: list[Compensated | None] | None = None) -> Iterator[None]:
    """While active, copy g of the stacked batch sees the component with only units kept[g] (None: all),
    and, where compensated[g] is given, its output projection replaced by that weight and bias."""
    out = adapter.out_proj(layer, component)
    assert out is not None
    unit = adapter.unit_width(component)
    n_units = out.in_features // unit
    copies = len(kept)
    mask = torch.ones(copies, n_units, dtype=out.weight.dtype, device=out.weight.device)
    for g, units in enumerate(kept):
        if units is not None:
            mask[g] = 0
            mask[g, units] = 1
    mask = mask.repeat_interleave(unit, dim=1)  # (copies, in_features)
    emptied = torch.tensor([units is not None and not units for units in kept], device=out.weight.device)

    def pre_hook(module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        x = args[0]
        stacked = x.view(copies, -1, *x.shape[1:])  # (copies, B, T, in)
        return ((stacked * mask.view(copies, 1, 1, -1)).view_as(x), *args[1:])

    def drop_bias(module: torch.nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        assert out.bias is not None  # registered only then
        stacked = output.view(copies, -1, *output.shape[1:])
        return (stacked - out.bias * emptied.view(copies, 1, 1, 1).to(output.dtype)).view_as(output)

    def refit_output(module: torch.nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
        assert compensated is not None
        x = args[0].view(copies, -1, args[0].shape[-1])  # already masked by the pre-hook
        y = output.view(copies, -1, output.shape[-1]).clone()
        for g, refit in enumerate(compensated):
            if refit is not None:
                y[g] = x[g] @ refit[0].T + refit[1]
        return y.view_as(output)

    handles = [out.register_forward_pre_hook(pre_hook)]
    if out.bias is not None and bool(emptied.any()):
        handles.append(out.register_forward_hook(drop_bias))
    if compensated is not None and any(refit is not None for refit in compensated):
        handles.append(out.register_forward_hook(refit_output))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _precision(device: torch.device, precision: str) -> contextlib.AbstractContextManager[Any]:
    if precision == "float32":
        return contextlib.nullcontext()
    if precision == "bfloat16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    raise ValueError(f"precision must be float32 or bfloat16, got {precision!r}")


Entries = dict[int, dict[str, list[int]]]  # layer -> component -> option indices to measure
Measured = dict[int, dict[str, dict[int, float]]]  # layer -> component -> option index -> ΔL


@torch.inference_mode()
def measure_entries(
    adapter: ModelAdapter,
    inputs: LayerInputs,
    scores: UnitScores,
    options: dict[str, list[list[int]]],
    entries: Entries,
    *,
    metric: str = "kl",
    reference: HeadReference | None = None,
    max_rows: int = 4096,
    chunk_rows: int = 0,
    precision: str = "float32",
    progress: bool = True,
    desc: str | None = None,
    on_layer: Callable[[int, dict[str, dict[int, float]]], None] | None = None,
    base: float | None = None,
    compensation: Compensation | None = None,
) -> Measured:
    """Exact ΔL of the listed options only, each against the model's own dense replay (`base`).

    Layers are visited in the order of `entries`; `on_layer(layer, values)` runs after each (a
    checkpoint hook). The model's current weights are the reference point: masks set by the caller
    on other components (a plan) stay in place, so this also measures conditional ΔL. `base` is
    `dense_base(...)` of the same model, inputs and reference, measured here when not given (pass it
    to calls that measure the same model on the same inputs, so it is replayed once). With
    `compensation`, each option is replayed with its output projection compensated as it would be
    saved (the compensation-aware table).
    """
    device = next(adapter.model.parameters()).device
    if reference is None:
        reference = dense_reference(adapter, inputs, metric, device, chunk_rows)
    batch_tokens = max(int(h.shape[0] * h.shape[1]) for h in inputs.final_hidden)
    per_pass = max(1, max_rows // batch_tokens)
    positions = sum(METRICS.get(metric).positions(int(h.shape[0]), int(h.shape[1])) for h in inputs.final_hidden)
    total = sum(len([k for k in ks if k]) for per in entries.values() for ks in per.values())
    bar = tqdm(total=total, desc=desc or f"profile ΔL ({metric}, exact)", unit="opt", disable=not progress)
    measured: Measured = {}
    with _precision(device, precision):
        if base is None:
            base = dense_base(adapter, inputs, reference, metric, device, chunk_rows)
        for layer, per_component in entries.items():
            row: dict[str, dict[int, float]] = {c: {0: 0.0} if 0 in per_component.get(c, []) else {} for c in COMPONENTS}
            for component in COMPONENTS:
                ks = [k for k in per_component.get(component, []) if k]
                jobs = [(k, kept_units(scores, adapter, layer, component, options[component][k])) for k in ks]
                for first in range(0, len(jobs), per_pass):
                    chunk = jobs[first : first + per_pass]
                    refits = [compensation(layer, component, kept) for _, kept in chunk] if compensation else None
                    sums = replay_stacked(adapter, inputs, layer, component, [kept for _, kept in chunk], reference,
                                           device, chunk_rows, refits)
                    for (k, _), total_sum in zip(chunk, sums.tolist(), strict=True):
                        row[component][k] = total_sum / positions - base
                    bar.update(len(chunk))
            measured[layer] = row
            if on_layer is not None:
                on_layer(layer, row)
    bar.close()
    return measured


@torch.inference_mode()
def dense_base(adapter: ModelAdapter, inputs: LayerInputs, reference: HeadReference, metric: str,
               device: torch.device, chunk_rows: int = 0) -> float:
    """The metric of the model's own replay: the zero point every ΔL is measured against.

    A replay of unchanged layers reproduces the cached final hidden states whatever layer it starts
    from (the per-layer values agree to the last bit on SmolLM2), so one replay of the cheapest
    start, the last layer, serves every layer.
    """
    positions = sum(METRICS.get(metric).positions(int(h.shape[0]), int(h.shape[1])) for h in inputs.final_hidden)
    sums = replay_stacked(adapter, inputs, adapter.n_layers - 1, COMPONENTS[0], [None], reference, device, chunk_rows)
    return float(sums[0]) / positions



def build_loss_table_batched(
    adapter: ModelAdapter,
    inputs: LayerInputs,
    scores: UnitScores,
    *,
    metric: str = "kl",
    channel_step: int,
    mlp_stride: int = 1,
    max_rows: int = 4096,
    chunk_rows: int = 0,
    precision: str = "float32",
    layers: list[int] | None = None,
    done: Measured | None = None,
    on_layer: Callable[[int, dict[str, dict[int, float]]], None] | None = None,
    progress: bool = True,
    desc: str | None = None,
    compensation: Compensation | None = None,
    thin: int = 1,
) -> LossTable:
    """ΔL for every option of every component of every layer, `max_rows` stacked tokens per pass.

    `layers` profiles only those layers (the others stay 0): for timing and cost models. `done`
    holds layers measured before (a resumed run): they are not replayed again. `thin` > 1 replays
    only every `thin`-th option of the grid (and the last) and interpolates the rest (a screen).
    """
    grid = option_grid(adapter, channel_step, mlp_stride).thinned(thin)
    start_time = time.perf_counter()
    layers = list(range(adapter.n_layers)) if layers is None else layers
    done = dict(done or {})
    todo = {layer: dict(grid.measured) for layer in layers if layer not in done}
    layer_wall: dict[int, float] = {}
    last = [time.perf_counter()]

    def timed(layer: int, row: dict[str, dict[int, float]]) -> None:
        layer_wall[layer] = round(time.perf_counter() - last[0], 4)
        last[0] = time.perf_counter()
        if on_layer is not None:
            on_layer(layer, row)

    measured = measure_entries(adapter, inputs, scores, grid.options, todo, metric=metric, max_rows=max_rows,
                               chunk_rows=chunk_rows, precision=precision, progress=progress,
                               desc=desc or f"profile ΔL ({metric}, batched)", on_layer=timed,
                               compensation=compensation) if todo else {}
    measured.update(done)
    batch_tokens = max(int(h.shape[0] * h.shape[1]) for h in inputs.final_hidden)
    meta = {"profiler": "exact", "tokens": calibration_tokens(inputs), "channel_step": channel_step,
            "mlp_stride": mlp_stride, "thin": thin, "measured": True, "precision": precision, "compensated": compensation is not None,
            "options_per_pass": max(1, max_rows // batch_tokens), "resumed_layers": sorted(done),
            "layer_wall_s": layer_wall, "wall_s": round(time.perf_counter() - start_time, 2)}
    return table_from_rows(adapter, grid, measured, scores.criterion, metric, meta)


def table_from_rows(adapter: ModelAdapter, grid: OptionGrid, measured: Measured, criterion: str, metric: str,
                    meta: dict[str, Any]) -> LossTable:
    """The loss table of measured rows: unmeasured options interpolated within each measured layer, others 0."""
    loss = grid.empty_loss()
    for layer, row in measured.items():
        for c, values in row.items():
            for k, value in values.items():
                loss[c][layer, int(k)] = value
        grid.interpolate_(loss, layer)
    return LossTable(metric=metric, criterion=criterion, options=grid.options, loss=loss, removed=grid.removed,
                     meta=meta, exact=grid.exact_mask(), param_unit=adapter.hidden)


def replay_stacked(adapter: ModelAdapter, inputs: LayerInputs, start: int, component: str,
                    kept: list[list[int] | None], reference: Any, device: torch.device, chunk_rows: int,
                    compensated: list[Compensated | None] | None = None) -> np.ndarray:
    """Summed metric of each option (copy) over all calibration batches, layers start...L replayed."""
    copies = len(kept)
    sums = torch.zeros(copies, dtype=torch.float64, device=device)
    norm, head = adapter.final_norm(), adapter.lm_head()
    dtype = next(adapter.model.parameters()).dtype
    for b in range(inputs.n_batches):
        hidden = inputs.hidden[start][b].to(device, dtype)
        batch = hidden.shape[0]
        hidden = hidden.repeat(copies, 1, 1)
        for layer in range(start, adapter.n_layers):
            kwargs = move_kwargs(stack_kwargs(inputs.kwargs[layer][b], batch, copies), device)
            if layer == start and any(units is not None for units in kept):
                with option_masks(adapter, layer, component, kept, compensated):
                    hidden = run_layer(adapter.layers[layer], hidden, kwargs)
            else:
                hidden = run_layer(adapter.layers[layer], hidden, kwargs)
        sums += metric_sums(norm, head, hidden, b, reference, copies, chunk_rows)
    return sums.cpu().numpy()

