"""The layer streamer: a model whose decoder layers are read from disk one at a time."""

from __future__ import annotations

import ctypes
import shutil
import tempfile
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from gapprune.models.adapter import ModelAdapter
from gapprune.models.streaming.safetensors_io import (
    TensorSource,
    folder_sources,
    read_header,
    read_tensor,
    write_safetensors,
)


class StreamedLayers(nn.ModuleList):
    """The decoder's layer list; indexing one layer loads it (and drops the others)."""

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):  # the decoder's own forward slices: loading happens in the pre-hooks
            return nn.ModuleList(list(self._modules.values())[index])
        layer = super().__getitem__(index)
        streamer = self.__dict__["streamer"]
        if not streamer.paused:
            streamer.load(index % len(self))
        return layer


class LayerStreamer:
    """Keeps one decoder layer resident; reads layers from their files and spills changed ones."""

    def __init__(self, layers: nn.ModuleList, prefixes: list[str], sources: dict[str, TensorSource],
                 dtype: torch.dtype, device: torch.device, scratch: Path) -> None:
        self.layers, self.prefixes, self.dtype, self.device, self.scratch = layers, prefixes, dtype, device, scratch
        self.sources = [{name.removeprefix(p): s for name, s in sources.items() if name.startswith(p)} for p in prefixes]
        self.resident: dict[int, dict[str, int]] = {}  # layer -> tensor ids as loaded (to notice changes)
        self.loads = 0
        self.paused = False  # indexing a layer does not load it (see `hooks_without_loading`)

    def _modules(self, index: int) -> dict[str, nn.Module]:
        return dict(self.layers._modules[str(index)].named_modules())

    def _set(self, index: int, name: str, value: torch.Tensor) -> None:
        owner, _, attr = name.rpartition(".")
        module = self._modules(index)[owner]
        if attr in module._parameters:
            module._parameters[attr] = nn.Parameter(value, requires_grad=False)
        else:
            module._buffers[attr] = value

    def _tensors(self, index: int) -> dict[str, torch.Tensor]:
        return dict(self.layers._modules[str(index)].state_dict(keep_vars=True))

    def load(self, index: int) -> None:
        if index in self.resident:
            return
        for other in list(self.resident):
            self.drop(other)
        for name, source in self.sources[index].items():
            self._set(index, name, read_tensor(source, self.dtype, self.device))
        self.resident[index] = {name: id(t) for name, t in self._tensors(index).items()}
        self.loads += 1

    def drop(self, index: int) -> None:
        """Back to meta; a layer changed since it was loaded is first written to the scratch folder."""
        tensors = self._tensors(index)
        if {name: id(t) for name, t in tensors.items()} != self.resident.pop(index):
            path = self.scratch / f"layer_{index}.safetensors"
            write_safetensors(path, tensors)
            self.sources[index] = read_header(path)
        for name, t in tensors.items():
            if name in self.sources[index]:
                self._set(index, name, torch.empty(t.shape, dtype=t.dtype, device="meta"))

    def close(self) -> None:
        shutil.rmtree(self.scratch, ignore_errors=True)


def streamer_of(model: nn.Module) -> LayerStreamer | None:
    return getattr(model, "_gapprune_streamer", None)


def is_streamed(model: nn.Module) -> bool:
    return streamer_of(model) is not None


@contextmanager
def hooks_without_loading(model: nn.Module) -> Iterator[None]:
    """Inside, indexing a streamed model's layers does not read them from disk: for installing hooks
    on every layer's modules (which reads their shapes, not their weights) without reading every
    layer once more before the pass that will read each in turn. Nothing for an in-memory model."""
    streamer = streamer_of(model)
    if streamer is None:
        yield
        return
    streamer.paused = True
    try:
        yield
    finally:
        streamer.paused = False


def _give_freed_memory_back() -> None:
    """Make glibc return freed tensors of 1 MB and more to the system at once.

    glibc raises its mmap threshold (up to 32 MB) after large blocks are freed; from then on
    tensors below it come from the heap, where freed space stays counted in the process. A model
    held a layer at a time frees a layer's worth of such tensors at every step, so the threshold
    is fixed (which also stops its adjustment). Elsewhere than glibc this does nothing.
    """
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


def _materialize_buffers_(model: nn.Module, device: torch.device) -> None:
    """Non-persistent buffers (rotary frequencies) are not in the files: build them as transformers does."""
    owners = {}
    for name, module in model.named_modules():
        for buffer_name in module._non_persistent_buffers_set:
            if module._buffers.get(buffer_name) is not None and module._buffers[buffer_name].is_meta:
                buffer = module._buffers[buffer_name]
                module._buffers[buffer_name] = torch.empty(buffer.shape, dtype=buffer.dtype, device=device)
                owners[name] = module
    for module in owners.values():
        model._init_weights(module)  # type: ignore[operator]


def open_streamed(folder: str | Path, *, dtype: torch.dtype = torch.float32, device: str = "cpu",
                  scratch_dir: str | Path | None = None) -> PreTrainedModel:
    """The model of a safetensors folder with its decoder layers left on disk (see the module docstring)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from gapprune.models import get_adapter
    from gapprune.models.modeling_gapprune import PRUNED_CLASS_FOR_ARCHITECTURE

    folder = Path(folder)
    _give_freed_memory_back()
    config = AutoConfig.from_pretrained(folder)
    base = (getattr(config, "architectures", None) or [""])[0].removeprefix("Gappruned")
    with torch.device("meta"):
        if getattr(config, "layer_shapes", None):
            model = PRUNED_CLASS_FOR_ARCHITECTURE[base](config)
        else:
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.eval()
    target = torch.device(device)
    _materialize_buffers_(model, target)
    adapter: ModelAdapter = get_adapter(model)
    names = {id(m): n for n, m in model.named_modules()}
    list_name = names[id(adapter.layers)]
    prefixes = [f"{list_name}.{i}." for i in range(adapter.n_layers)]
    sources = folder_sources(folder)
    for name, source in sources.items():  # everything outside the decoder layers stays resident
        if not name.startswith(f"{list_name}."):
            owner, _, attr = name.rpartition(".")
            module = model.get_submodule(owner)
            value = read_tensor(source, dtype, target)
            if attr in module._parameters:
                module._parameters[attr] = nn.Parameter(value, requires_grad=False)
            else:
                module._buffers[attr] = value
    if getattr(config, "tie_word_embeddings", False):
        model.get_output_embeddings().weight = model.get_input_embeddings().weight
    scratch = Path(tempfile.mkdtemp(prefix="gapprune-layers-", dir=scratch_dir))
    parent_name, _, attr = list_name.rpartition(".")
    streamed = StreamedLayers(list(adapter.layers))
    setattr(model.get_submodule(parent_name), attr, streamed)
    streamer = LayerStreamer(streamed, prefixes, sources, dtype, target, scratch)
    weakref.finalize(streamer, shutil.rmtree, scratch, True)  # the scratch folder goes with the model
    streamed.__dict__["streamer"] = streamer
    model.__dict__["_gapprune_streamer"] = streamer
    for i, layer in enumerate(streamed._modules.values()):
        layer.register_forward_pre_hook(lambda module, args, i=i: streamer.load(i))
    missing = [n for n, p in model.named_parameters() if p.is_meta and not n.startswith(f"{list_name}.")]
    if missing:
        raise ValueError(f"{folder} lacks weights outside the decoder layers: {missing[:5]}")
    return model
