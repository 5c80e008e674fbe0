"""The exact ΔL profiler in one traversal of the decoder: the same table as `build_loss_table_batched`.

The batched profiler replays, for each start layer l, layers l...L: every layer's weights are used
L times over, which is fine in memory and ruinous when each layer must be read from disk or sent
to a device. Here the loop order is turned around: layer j is visited once, and every pending
option replay (start layer l ≤ j, option k, and each start layer's dense base) advances through it,
in chunks of `max_rows` stacked tokens. A replay starts at its own layer under the unit mask of
its option (`option_masks`, as in the batched profiler); after the last layer its metric runs
(`metric_sums` against the dense head reference) and it is dropped.

The pending hidden states (replays x tokens x hidden) live in host memory, or, above
`max_pending_bytes`, in a scratch file read and written at offsets (not memory-mapped, so the
pages count against the page cache rather than this process's resident memory).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from gapprune.calibrate.capture import LayerInputs, move_kwargs, run_layer
from gapprune.components import COMPONENTS
from gapprune.importance.base import UnitScores
from gapprune.models.adapter import ModelAdapter
from gapprune.options import kept_units
from gapprune.profiling.batched import (
    Measured,
    option_masks,
    stack_kwargs,
    table_from_rows,
)
from gapprune.profiling.head import dense_reference, metric_sums
from gapprune.profiling.loss_table import LossTable, calibration_tokens, option_grid


@dataclass(frozen=True)
class Replay:
    """One option replay: from `start`, with `component` cut to `kept` units (component "base": dense)."""

    start: int
    component: str
    option: int
    kept: list[int] | None


class PendingStates:
    """Hidden states of every replay for every calibration batch: slot (replay, batch) -> (B, T, hidden).

    In memory, or in a scratch file under `folder` (deleted on `close`) when larger than `max_bytes`.
    """

    def __init__(self, n_replays: int, shapes: list[tuple[int, ...]], dtype: torch.dtype, max_bytes: int,
                 folder: str | Path | None = None) -> None:
        self.shapes, self.dtype = shapes, dtype
        itemsize = torch.empty((), dtype=dtype).element_size()
        self.slot_bytes = [int(np.prod(s)) * itemsize for s in shapes]
        self.batch_offset = np.cumsum([0, *self.slot_bytes])[:-1] * n_replays  # each batch: n_replays slots
        self.nbytes = sum(self.slot_bytes) * n_replays
        self.memory: list[torch.Tensor] | None = None
        self.fd: int | None = None
        if self.nbytes <= max_bytes:
            self.memory = [torch.empty(n_replays, *s, dtype=dtype) for s in shapes]  # (N, B, T, h) per batch
        else:
            handle, self.path = tempfile.mkstemp(prefix="gapprune-pending-", suffix=".bin", dir=folder)
            self.fd = handle
            os.ftruncate(handle, self.nbytes)

    def _offset(self, replay: int, batch: int) -> int:
        return int(self.batch_offset[batch]) + replay * self.slot_bytes[batch]

    def read(self, replays: list[int], batch: int) -> torch.Tensor:
        """(len(replays) * B, T, hidden): the slots, stacked as `stack_kwargs` expects (copy-major)."""
        if self.memory is not None:
            return self.memory[batch][replays].flatten(0, 1)
        out = torch.empty(len(replays), *self.shapes[batch], dtype=self.dtype)
        raw = out.view(len(replays), -1).view(torch.uint8).numpy()
        assert self.fd is not None
        for i, r in enumerate(replays):
            os.preadv(self.fd, [raw[i].data], self._offset(r, batch))
        return out.flatten(0, 1)

    def write(self, replays: list[int], batch: int, hidden: torch.Tensor) -> None:
        states = hidden.detach().to("cpu", self.dtype).reshape(len(replays), *self.shapes[batch])
        if self.memory is not None:
            self.memory[batch][replays] = states
            return
        raw = states.contiguous().view(len(replays), -1).view(torch.uint8).numpy()
        assert self.fd is not None
        for i, r in enumerate(replays):
            os.pwrite(self.fd, raw[i].data, self._offset(r, batch))

    def close(self) -> None:
        self.memory = None
        if self.fd is not None:
            os.close(self.fd)
            os.unlink(self.path)
            self.fd = None


def _chunks(items: list[int], size: int) -> Iterator[list[int]]:
    for first in range(0, len(items), size):
        yield items[first : first + size]


def _groups(replays: list[Replay], indices: list[int]) -> list[tuple[str | None, list[int]]]:
    """The replays starting at one layer, grouped by the component they mask; the base rides in the first."""
    base = [i for i in indices if replays[i].component == "base"]
    groups: list[tuple[str | None, list[int]]] = []
    for component in COMPONENTS:
        members = [i for i in indices if replays[i].component == component]
        if members:
            groups.append((component, (base if not groups else []) + members))
    return groups or [(None, base)]


@torch.inference_mode()
def build_loss_table_layer_major(
    adapter: ModelAdapter,
    inputs: LayerInputs,
    scores: UnitScores,
    *,
    metric: str = "kl",
    channel_step: int,
    mlp_stride: int = 1,
    max_rows: int = 1024,
    chunk_rows: int = 0,
    layers: list[int] | None = None,
    done: Measured | None = None,
    on_layer: Callable[[int, dict[str, dict[int, float]]], None] | None = None,
    progress: bool = True,
    max_pending_bytes: int = 2**30,
    scratch_dir: str | Path | None = None,
) -> LossTable:
    """ΔL for every option of every component of the start `layers` (default all), one pass over the decoder.

    Same arguments and result as `build_loss_table_batched`; `max_pending_bytes` bounds the host memory
    of the pending hidden states (beyond it they go to a scratch file in `scratch_dir`). `max_rows`
    is smaller by default (1024, not 4096): this profiler serves models held a layer at a time, and a
    pass's MLP activations (about 4 x rows x intermediate floats: 900 MB at 4096 rows for an MLP of
    14336) would otherwise outweigh the layer itself.
    """
    start_time = time.perf_counter()
    grid = option_grid(adapter, channel_step, mlp_stride)
    layers = list(range(adapter.n_layers)) if layers is None else layers
    done = dict(done or {})
    todo = sorted(layer for layer in layers if layer not in done)
    device = next(adapter.model.parameters()).device
    dtype = next(adapter.model.parameters()).dtype
    replays: list[Replay] = []
    for start in todo:  # layer by layer: a streamed model loads each layer once here
        replays.append(Replay(start, "base", -1, None))
        for c in COMPONENTS:
            replays += [Replay(start, c, k, kept_units(scores, adapter, start, c, grid.options[c][k]))
                        for k in grid.measured[c] if k]
    measured: Measured = {}
    if replays:
        measured = _traverse(adapter, inputs, replays, metric, device, dtype, max_rows, chunk_rows, progress,
                             max_pending_bytes, scratch_dir)
        for layer in todo:
            measured[layer] = {c: ({0: 0.0} | measured[layer][c]) if 0 in grid.measured[c] else measured[layer][c]
                               for c in COMPONENTS}
            if on_layer is not None:
                on_layer(layer, measured[layer])
    measured.update(done)
    batch_tokens = max(int(h.shape[0] * h.shape[1]) for h in inputs.final_hidden)
    meta = {"profiler": "exact", "traversal": "layer_major", "tokens": calibration_tokens(inputs),
            "channel_step": channel_step, "mlp_stride": mlp_stride, "measured": True, "precision": "float32",
            "options_per_pass": max(1, max_rows // batch_tokens), "resumed_layers": sorted(done),
            "wall_s": round(time.perf_counter() - start_time, 2)}
    return table_from_rows(adapter, grid, measured, scores.criterion, metric, meta)


def _traverse(adapter: ModelAdapter, inputs: LayerInputs, replays: list[Replay], metric: str, device: torch.device,
              dtype: torch.dtype, max_rows: int, chunk_rows: int, progress: bool, max_pending_bytes: int,
              scratch_dir: str | Path | None) -> Measured:
    """Advance every replay from its start layer to the last, then sum its metric; ΔL = value − its base."""
    n_layers = adapter.n_layers
    reference = dense_reference(adapter, inputs, metric, device, chunk_rows)
    norm, head = adapter.final_norm(), adapter.lm_head()
    batch_tokens = max(int(h.shape[0] * h.shape[1]) for h in inputs.final_hidden)
    per_pass = max(1, max_rows // batch_tokens)
    positions = sum(int(h.shape[0]) * (int(h.shape[1]) - (metric == "nll")) for h in inputs.final_hidden)
    sums = np.zeros(len(replays))
    first = min(r.start for r in replays)
    shapes = [tuple(h.shape) for h in inputs.hidden[first]]
    pending = PendingStates(len(replays), shapes, dtype, max_pending_bytes, scratch_dir)
    bar = tqdm(total=n_layers - first, desc=f"profile ΔL ({metric}, layer-major)", unit="layer", disable=not progress)
    try:
        for j in range(first, n_layers):
            layer = adapter.layers[j]  # a streamed model loads layer j here, once
            running = [i for i, r in enumerate(replays) if r.start < j]
            starting = [i for i, r in enumerate(replays) if r.start == j]
            for b in range(inputs.n_batches):
                batch = int(inputs.hidden[j][b].shape[0])

                def finish(chunk: list[int], hidden: torch.Tensor, b: int = b, j: int = j) -> None:
                    if j == n_layers - 1:
                        sums[chunk] += metric_sums(norm, head, hidden, b, reference, len(chunk), chunk_rows).cpu().numpy()
                    else:
                        pending.write(chunk, b, hidden)

                for chunk in _chunks(running, per_pass):
                    kwargs = move_kwargs(stack_kwargs(inputs.kwargs[j][b], batch, len(chunk)), device)
                    finish(chunk, run_layer(layer, pending.read(chunk, b).to(device, dtype), kwargs))
                for component, members in _groups(replays, starting):
                    for chunk in _chunks(members, per_pass):
                        kwargs = move_kwargs(stack_kwargs(inputs.kwargs[j][b], batch, len(chunk)), device)
                        hidden = inputs.hidden[j][b].to(device, dtype).repeat(len(chunk), 1, 1)
                        masks = (option_masks(adapter, j, component, [replays[i].kept for i in chunk])
                                 if component is not None else contextlib.nullcontext())
                        with masks:
                            finish(chunk, run_layer(layer, hidden, kwargs))
            bar.update(1)
    finally:
        bar.close()
        pending.close()
    values = sums / positions
    base = {r.start: values[i] for i, r in enumerate(replays) if r.component == "base"}
    measured: Measured = {}
    for i, r in enumerate(replays):
        row = measured.setdefault(r.start, {c: {} for c in COMPONENTS})
        if r.component != "base":
            row[r.component][r.option] = float(values[i] - base[r.start])
    return measured
