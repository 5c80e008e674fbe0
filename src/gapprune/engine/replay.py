"""Replays from one start layer: layers l...L run again on the cached input of layer l, several
options per pass, and their metric summed at the head.

Only layers l...L change when a component of layer l is pruned, so a replay starts from the input
that the dense pass cached (`capture.py`). Several options of one component run as one stacked
batch: the cached input is repeated once per option and each copy sees its own unit mask
(`masks.option_masks`), so one pass measures `max_rows // tokens per batch` options. The metric
needs no vocabulary-sized dense reference and no full logits tensor (`head.py`). The layer-major
schedule, for models read a layer at a time, is `layer_major.py`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from gapprune.components import COMPONENTS
from gapprune.engine.capture import LayerInputs, move_kwargs, run_layer
from gapprune.engine.head import HeadReference, dense_reference, metric_sums, with_rough_head
from gapprune.engine.masks import Compensated, option_masks, stack_kwargs
from gapprune.engine.metrics import METRICS
from gapprune.models.adapter import ModelAdapter

Entries = dict[int, dict[str, list[int]]]  # layer -> component -> option indices to measure
KeptUnits = Callable[[int, str, int], list[int]]  # (layer, component, option index) -> the units it keeps
Measured = dict[int, dict[str, dict[int, float]]]  # layer -> component -> option index -> ΔL
Compensation = Callable[[int, str, list[int]], Compensated | None]  # (layer, component, kept units) -> refit


def positions(inputs: LayerInputs, metric: str) -> int:
    """The positions the metric averages over, in all calibration batches."""
    return sum(METRICS.get(metric).positions(int(h.shape[0]), int(h.shape[1])) for h in inputs.final_hidden)


def tokens_per_batch(inputs: LayerInputs) -> int:
    return max(int(h.shape[0] * h.shape[1]) for h in inputs.final_hidden)


@functools.cache
def cpu_flags() -> frozenset[str]:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:  # not Linux: no flags known, so no claim of fast bf16
        return frozenset()
    return frozenset(next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), []))


def fast_bf16(device: torch.device) -> bool:
    """Whether bf16 matrix work is faster than float32 here: a CUDA GPU that has it, or a CPU with AMX
    tiles (on a two-core Xeon with AMX torch's bf16 linear ran 2.5-4.4x float32's speed and the bf16
    screen took 34.6 s against 59.7). AVX-512-BF16 alone is not enough: on such a Xeon the bf16 linear
    ran at 52-74% of float32's speed and the bf16 screen took 81 s against 63 (`benchmarks/profilers.py
    kernels`, records `matmul` and `screen_precision`); on AVX2 bf16 is converted in software, slower still."""
    if device.type == "cuda":  # native bf16 matrix units from Ampere (8.0) on; older GPUs emulate it, slowly
        return torch.cuda.get_device_capability(device) >= (8, 0)
    return device.type == "cpu" and "amx_bf16" in cpu_flags()


def resolve_precision(precision: str, device: torch.device) -> str:
    """`auto` -> bfloat16 where `fast_bf16`, else float32; float32 and bfloat16 as they are."""
    if precision == "auto":
        return "bfloat16" if fast_bf16(device) else "float32"
    return precision


def precision_context(device: torch.device, precision: str) -> contextlib.AbstractContextManager[Any]:
    """float32 as the weights are, or bf16 autocast (for GPUs: check the ranking against float32 first)."""
    if precision == "float32":
        return contextlib.nullcontext()
    if precision == "bfloat16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    raise ValueError(f"precision must be float32 or bfloat16, got {precision!r}")


def replay_stacked(adapter: ModelAdapter, inputs: LayerInputs, start: int, component: str | None,
                   kept: list[list[int] | None], reference: HeadReference, device: torch.device, chunk_rows: int = 0,
                   compensated: list[Compensated | None] | None = None) -> np.ndarray:
    """Summed metric of each option (copy) over all calibration batches, layers start...L replayed.

    Copy g runs with `component` of layer `start` cut to kept[g] (None: as the model is now, with
    whatever masks the caller set); `compensated[g]` replaces its output projection.
    """
    copies = len(kept)
    sums = torch.zeros(copies, dtype=torch.float64, device=device)
    norm, head = adapter.final_norm(), adapter.lm_head()
    dtype = next(adapter.model.parameters()).dtype
    masked = component is not None and any(units is not None for units in kept)
    for b in range(inputs.n_batches):
        hidden = inputs.hidden[start][b].to(device, dtype)
        batch = hidden.shape[0]
        hidden = hidden.repeat(copies, 1, 1)
        for layer in range(start, adapter.n_layers):
            kwargs = move_kwargs(stack_kwargs(inputs.kwargs[layer][b], batch, copies), device)
            if layer == start and masked:
                assert component is not None
                with option_masks(adapter, layer, component, kept, compensated):
                    hidden = run_layer(adapter.layers[layer], hidden, kwargs)
            else:
                hidden = run_layer(adapter.layers[layer], hidden, kwargs)
        sums += metric_sums(norm, head, hidden, b, reference, copies, chunk_rows)
    return sums.cpu().numpy()


def replay_metric(adapter: ModelAdapter, inputs: LayerInputs, start: int, metric: str, reference: HeadReference,
                  device: torch.device) -> float:
    """Mean metric per position of the model as it is now, layers start...L replayed."""
    if reference.metric.name != metric:
        raise ValueError(f"the reference was made for metric {reference.metric.name!r}, not {metric!r}")
    return float(replay_stacked(adapter, inputs, start, None, [None], reference, device)[0]) / positions(inputs, metric)


@torch.inference_mode()
def dense_base(adapter: ModelAdapter, inputs: LayerInputs, reference: HeadReference, metric: str,
               device: torch.device, chunk_rows: int = 0) -> float:
    """The metric of the model's own replay: the zero point every ΔL is measured against.

    A replay of unchanged layers reproduces the cached final hidden states whatever layer it starts
    from (the per-layer values agree to the last bit on SmolLM2), so one replay of the cheapest
    start, the last layer, serves every layer.
    """
    sums = replay_stacked(adapter, inputs, adapter.n_layers - 1, None, [None], reference, device, chunk_rows)
    return float(sums[0]) / positions(inputs, metric)


@torch.inference_mode()
def measure_entries(
    adapter: ModelAdapter,
    inputs: LayerInputs,
    entries: Entries,
    kept_units: KeptUnits,
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
    """Exact ΔL of the listed options, each against the model's own dense replay (`base`); `kept_units`
    says which units an option keeps. Option 0 is the dense option: ΔL 0 by definition, not replayed.

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
    if precision == "bfloat16" and base is None:  # an estimate, its base measured below by the same head:
        # its logsumexp takes the bf16 product too (`head.RoughHead`)
        reference = with_rough_head(reference, adapter.final_norm(), adapter.lm_head(), inputs.final_hidden, device)
    per_pass = max(1, max_rows // tokens_per_batch(inputs))
    n_positions = positions(inputs, metric)
    total = sum(len([k for k in ks if k]) for per in entries.values() for ks in per.values())
    bar = tqdm(total=total, desc=desc or f"profile ΔL ({metric}, exact)", unit="opt", disable=not progress)
    measured: Measured = {}
    with precision_context(device, precision):
        if base is None:
            base = dense_base(adapter, inputs, reference, metric, device, chunk_rows)
        for layer, per_component in entries.items():
            row: dict[str, dict[int, float]] = {c: {0: 0.0} if 0 in per_component.get(c, []) else {} for c in COMPONENTS}
            for component in COMPONENTS:
                jobs = [(k, kept_units(layer, component, k)) for k in per_component.get(component, []) if k]
                for first in range(0, len(jobs), per_pass):
                    chunk = jobs[first : first + per_pass]
                    refits = [compensation(layer, component, kept) for _, kept in chunk] if compensation else None
                    sums = replay_stacked(adapter, inputs, layer, component, [kept for _, kept in chunk], reference,
                                          device, chunk_rows, refits)
                    for (k, _), total_sum in zip(chunk, sums.tolist(), strict=True):
                        row[component][k] = total_sum / n_positions - base
                    bar.update(len(chunk))
            measured[layer] = row
            if on_layer is not None:
                on_layer(layer, row)
    bar.close()
    return measured
