"""One dense pass over the calibration set that caches every decoder layer's input.

The decoder's own forward hands each layer its keyword arguments (position embeddings, masks, cache
positions, whatever a transformers release adds); they are recorded exactly as passed, so later
stages can replay layers l...L without re-running layers 0...l-1. No Catcher that raises.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from gapprune.engine.observe import InputTaken, observing
from gapprune.models.adapter import ModelAdapter
from gapprune.models.streaming.streamer import hooks_without_loading

_DROPPED_KWARGS = ("past_key_values", "past_key_value", "cache", "use_cache", "output_attentions")


@dataclass
class LayerInputs:
    """Cached inputs of every decoder layer for a calibration set split into batches.

    hidden[l][b]: (B, T, hidden) on CPU in the model's dtype, the input of layer l for batch b.
    kwargs[l][b]: the keyword arguments layer l received for batch b (tensors on CPU).
    final_hidden[b]: (B, T, hidden), the input of the final norm (the last layer's output).
    """

    hidden: list[list[torch.Tensor]]
    kwargs: list[list[dict[str, Any]]]
    final_hidden: list[torch.Tensor]
    input_ids: list[torch.Tensor] = field(default_factory=list)

    @property
    def n_layers(self) -> int:
        return len(self.hidden)

    @property
    def n_batches(self) -> int:
        return len(self.final_hidden)

    def prefix(self, n_batches: int) -> LayerInputs:
        """The first `n_batches` calibration batches (the loss table is measured on such a prefix)."""
        return LayerInputs(
            hidden=[h[:n_batches] for h in self.hidden],
            kwargs=[k[:n_batches] for k in self.kwargs],
            final_hidden=self.final_hidden[:n_batches],
            input_ids=self.input_ids[:n_batches],
        )

    def first(self, n_samples: int) -> LayerInputs:
        """The first `n_samples` calibration windows, cutting the last batch they reach if needed
        (the loss table is measured on such a prefix; fewer windows than one batch screen cheaply)."""
        return self.windows(0, n_samples)

    def windows(self, start: int, stop: int) -> LayerInputs:
        """Calibration windows start...stop-1 (counted across batches), batches cut where needed: the
        windows after a screen's, which an exact replay of a screened option still has to measure."""
        hidden: list[list[torch.Tensor]] = [[] for _ in self.hidden]
        kwargs: list[list[dict[str, Any]]] = [[] for _ in self.kwargs]
        final, ids = [], []
        offset = 0
        for b, h in enumerate(self.final_hidden):
            size = int(h.shape[0])
            lo, hi = max(start - offset, 0), min(stop - offset, size)
            offset += size
            if lo >= hi:
                continue
            for layer in range(self.n_layers):
                hidden[layer].append(self.hidden[layer][b][lo:hi])
                kwargs[layer].append(_rows(self.kwargs[layer][b], size, lo, hi))
            final.append(h[lo:hi])
            if self.input_ids:
                ids.append(self.input_ids[b][lo:hi])
        return LayerInputs(hidden=hidden, kwargs=kwargs, final_hidden=final, input_ids=ids)

    @property
    def n_windows(self) -> int:
        return sum(int(h.shape[0]) for h in self.final_hidden)

    def first_layer_only(self) -> LayerInputs:
        """Layer 0's inputs and every layer's keyword arguments: what a replay from the first layer
        needs (sequential compensation), without holding the deeper layers' hidden states."""
        return LayerInputs(hidden=self.hidden[:1], kwargs=self.kwargs, final_hidden=[], input_ids=self.input_ids)

    def layer_output(self, layer: int, batch: int) -> torch.Tensor:
        """The dense output of `layer` = the input of the next layer (or of the final norm)."""
        return self.hidden[layer + 1][batch] if layer + 1 < self.n_layers else self.final_hidden[batch]


def _rows(kwargs: dict[str, Any], batch: int, start: int, stop: int) -> dict[str, Any]:
    """Per-sample tensors (leading dim == batch > 1) cut to rows start...stop-1; broadcast ones stay."""

    def cut(value: Any) -> Any:
        if isinstance(value, torch.Tensor) and value.ndim >= 2 and value.shape[0] == batch and batch > 1:
            return value[start:stop]
        if isinstance(value, tuple):
            return tuple(cut(v) for v in value)
        return value

    return kwargs if (start, stop) == (0, batch) else {k: cut(v) for k, v in kwargs.items()}


def _to(value: Any, device: torch.device | str, dtype: torch.dtype | None = None) -> Any:
    """Move tensors (also inside tuples/lists/dicts) to a device; floats optionally to a dtype."""
    if isinstance(value, torch.Tensor):
        if dtype is not None and value.is_floating_point():
            return value.to(device=device, dtype=dtype)
        return value.to(device)
    if isinstance(value, tuple):
        return tuple(_to(v, device, dtype) for v in value)
    if isinstance(value, list):
        return [_to(v, device, dtype) for v in value]
    if isinstance(value, dict):
        return {k: _to(v, device, dtype) for k, v in value.items()}
    return value


def move_kwargs(kwargs: dict[str, Any], device: torch.device | str, dtype: torch.dtype | None = None) -> dict[str, Any]:
    return {k: _to(v, device, dtype) for k, v in kwargs.items()}


def batches(input_ids: torch.Tensor, batch_size: int) -> Iterator[torch.Tensor]:
    for start in range(0, input_ids.shape[0], batch_size):
        yield input_ids[start : start + batch_size]


AroundLayer = Callable[[int, "LayerInputs"], AbstractContextManager[None]]


class _KwargsOnly(nn.Module):
    """Stands in for a decoder layer while the decoder's own forward builds each layer's keyword
    arguments (masks, position embeddings: per layer type on Gemma 3): records them, computes nothing.
    Attributes the decoder reads from its layers (`attention_type`) come from the real one."""

    def __init__(self, layer: nn.Module, record: Callable[[tuple[Any, ...], dict[str, Any]], None]) -> None:
        super().__init__()
        self.__dict__["_real"], self.__dict__["_record"] = layer, record

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["_real"], name)

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        self.__dict__["_record"](args, kwargs)
        return args[0] if args else kwargs["hidden_states"]


@contextlib.contextmanager
def _layers_replaced(model: nn.Module, layers: nn.ModuleList, stand_ins: nn.ModuleList) -> Iterator[None]:
    """`layers` (the decoder's layer list) swapped for `stand_ins` where the model holds it."""
    found = next(((module, child_name) for module in model.modules()
                  for child_name, child in module.named_children() if child is layers), None)
    if found is None:
        raise RuntimeError(f"{type(model).__name__} does not hold the adapter's decoder layers as a submodule; "
                           "its adapter's `layers` must return the model's own layer list")
    parent, name = found
    setattr(parent, name, stand_ins)
    try:
        yield
    finally:
        setattr(parent, name, layers)


@torch.inference_mode()
def capture_layer_inputs(
    adapter: ModelAdapter,
    input_ids: torch.Tensor,
    *,
    batch_size: int = 8,
    observers: Callable[[], list[tuple[nn.Module, Callable[[torch.Tensor], None]]]] | None = None,
    around_layer: AroundLayer | None = None,
    progress: bool = True,
) -> LayerInputs:
    """Run the dense model once over `input_ids` (n, T) and cache every layer's inputs.

    Layer-major: the decoder's own forward runs once per batch with its layers stood in for
    (`_KwargsOnly`), which gives layer 0's input and every layer's keyword arguments exactly as the
    model passes them; then layer l runs over every batch before layer l + 1. The numbers are those
    of the ordinary forward (the same layer on the same inputs), and a layer is visited once: a
    streamed model reads it once, and `around_layer(l, inputs)` is entered while layer l runs over
    the whole calibration set (its inputs complete in `inputs.hidden[l]`) and left when its outputs
    are — what the Gram matrices and the unit scores of that layer need, without replaying it.

    The cache keeps the activations' own dtype: a bf16 model computes them in bf16, so float32
    would hold the same numbers in twice the bytes (0.7 GB instead of 0.35 GB for Qwen2.5-1.5B's
    32 windows). Replays cast to the weights' dtype, statistics to float32.

    `observers()` names modules inside the decoder layers and what to call with their inputs during the
    same pass (statistics; `engine/observe.py`); it reads their shapes, not their weights (a streamed
    model's layers are not loaded for it).
    """
    model = adapter.model
    device = next(model.parameters()).device
    layers = adapter.layers
    n_layers = len(layers)
    inputs = LayerInputs(hidden=[[] for _ in range(n_layers)], kwargs=[[] for _ in range(n_layers)],
                         final_hidden=[], input_ids=[])

    def recorder(index: int) -> Callable[[tuple[Any, ...], dict[str, Any]], None]:
        def record(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if index == 0:
                inputs.hidden[0].append((args[0] if args else kwargs["hidden_states"]).detach().cpu())
            kept = {k: v for k, v in kwargs.items() if k not in _DROPPED_KWARGS and k != "hidden_states"}
            inputs.kwargs[index].append(move_kwargs(kept, "cpu"))

        return record

    stand_ins = nn.ModuleList([_KwargsOnly(layers._modules[str(i)], recorder(i)) for i in range(n_layers)])
    with _layers_replaced(model, layers, stand_ins):
        for batch in batches(input_ids, batch_size):
            model.get_decoder()(input_ids=batch.to(device), use_cache=False)
            inputs.input_ids.append(batch.cpu())
    with hooks_without_loading(model):  # a streamed model reads each layer once, in the loop below
        points = observers() if observers is not None else []
    with observing(points):
        for index in tqdm(range(n_layers), desc="capture", unit="layer", disable=not progress):
            layer = layers[index]  # a streamed model loads the layer here, once
            param = next(layer.parameters())
            outputs = inputs.hidden[index + 1] if index + 1 < n_layers else inputs.final_hidden
            with around_layer(index, inputs) if around_layer is not None else contextlib.nullcontext():
                for hidden, kwargs in zip(inputs.hidden[index], inputs.kwargs[index], strict=True):
                    out = run_layer(layer, hidden.to(param.device), move_kwargs(kwargs, param.device))
                    outputs.append(out.detach().cpu())
    return inputs


def run_layer(layer: nn.Module, hidden: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
    """Call one decoder layer; transformers releases differ in returning a tensor or a tuple."""
    out = layer(hidden, **kwargs)
    return out[0] if isinstance(out, tuple) else out


def _stop(module: nn.Module, args: tuple[Any, ...]) -> None:
    raise InputTaken


def replay_layer(adapter: ModelAdapter, layer: int, batches: list[torch.Tensor], kwargs: list[dict[str, Any]], *,
                 stop_at: nn.Module | None = None) -> list[torch.Tensor]:
    """Run decoder layer `layer` over its input `batches` (with their keyword arguments), cast to the weights'
    device and dtype; its outputs on the CPU. Observers installed by the caller see the pass. `stop_at`: each
    batch stops once that module has its input (after the observers), and nothing is returned."""
    block = adapter.layers[layer]  # a streamed model loads the layer here
    param = next(block.parameters(), None)
    if param is None:  # a layer pruned empty passes its input through: cast as the model's weights
        param = next(adapter.model.parameters())
    outputs = []
    stop = stop_at.register_forward_pre_hook(_stop) if stop_at is not None else None
    try:
        for hidden, layer_kwargs in zip(batches, kwargs, strict=True):
            try:
                out = run_layer(block, hidden.to(param.device, param.dtype), move_kwargs(layer_kwargs, param.device))
            except InputTaken:
                continue
            outputs.append(out.cpu())
    finally:
        if stop is not None:
            stop.remove()
    return [] if stop_at is not None else outputs
