"""The layer-major schedule: every pending replay advances through layer j together, so each
layer is visited once.

Replaying from each start layer l (`replay.py`) uses layer j's weights once per l ≤ j: fine in
memory, ruinous when each layer must be read from disk or sent to a device. Here the loop order is
turned around: layer j is visited once, and every pending replay (start layer l ≤ j, an option,
and each start layer's dense base) advances through it, in chunks of `max_rows` stacked tokens. A
replay starts at its own layer under the unit mask of its option (`masks.option_masks`); after
the last layer its metric runs (`head.metric_sums`) and it is dropped.

The pending hidden states (replays x tokens x hidden) live in host memory, or, above
`max_pending_bytes`, in a scratch file read and written at offsets (not memory-mapped, so the
pages count against the page cache rather than this process's resident memory).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from gapprune.components import COMPONENTS
from gapprune.engine.capture import LayerInputs, move_kwargs, run_layer
from gapprune.engine.head import dense_reference, metric_sums
from gapprune.engine.masks import option_masks, stack_kwargs
from gapprune.engine.replay import Measured, positions, tokens_per_batch
from gapprune.models.adapter import ModelAdapter


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
def measure_layer_major(adapter: ModelAdapter, inputs: LayerInputs, replays: list[Replay], *, metric: str = "kl",
                        max_rows: int = 1024, chunk_rows: int = 0, progress: bool = True,
                        max_pending_bytes: int = 2**30, scratch_dir: str | Path | None = None) -> Measured:
    """Advance every replay from its start layer to the last, then sum its metric; ΔL = value − the
    base replay of its start layer (each start layer needs one `Replay(start, "base", -1, None)`)."""
    n_layers = adapter.n_layers
    device = next(adapter.model.parameters()).device
    dtype = next(adapter.model.parameters()).dtype
    reference = dense_reference(adapter, inputs, metric, device, chunk_rows)
    norm, head = adapter.final_norm(), adapter.lm_head()
    per_pass = max(1, max_rows // tokens_per_batch(inputs))
    n_positions = positions(inputs, metric)
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
    values = sums / n_positions
    base = {r.start: values[i] for i, r in enumerate(replays) if r.component == "base"}
    measured: Measured = {}
    for i, r in enumerate(replays):
        row = measured.setdefault(r.start, {c: {} for c in COMPONENTS})
        if r.component != "base":
            row[r.component][r.option] = float(values[i] - base[r.start])
    return measured
