"""A model whose decoder layers stay on disk: about one layer's weights in memory at a time.

`open_streamed(folder)` builds the model on the meta device (no memory, no random init), loads the
weights outside the decoder layers (embeddings, final norm, LM head) and leaves every layer's
parameters on meta. A layer's weights are read from the safetensors files when it is needed, and
every other layer is dropped back to meta at that moment, so at most one layer is resident:

* a forward pre-hook loads a layer as the model reaches it (capture, evaluation, generation);
* `adapter.layers[i]` loads layer i (the list is a `StreamedLayers`), so scoring, signals, the
  layer-major profiler, surgery and compensation, which all go through the adapter layer by layer,
  work unchanged.

A layer that was changed while resident (surgery, compensation: its parameters are no longer the
tensors that were loaded) is written to a scratch folder when dropped and read from there after.
`save_streamed` writes the model layer by layer as sharded safetensors with an index, which
`from_pretrained` loads. Reads go through `os.preadv` into preallocated tensors, not through a
memory map, so the file pages count against the page cache rather than the process's memory.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import struct
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gapprune.models.adapter import ModelAdapter

_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}
INDEX_FILE = "model.safetensors.index.json"


@dataclass(frozen=True)
class TensorSource:
    """Where one tensor lies: file, byte offset, dtype and shape."""

    path: Path
    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]


def read_header(path: Path) -> dict[str, TensorSource]:
    """The tensors of one safetensors file (8-byte header length, JSON header, then raw data)."""
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    return {name: TensorSource(path, 8 + length + info["data_offsets"][0], _DTYPES[info["dtype"]], tuple(info["shape"]))
            for name, info in header.items()}


def folder_sources(folder: Path) -> dict[str, TensorSource]:
    """Every tensor of a model folder (one `model.safetensors` or shards listed in the index)."""
    index = folder / INDEX_FILE
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else ["model.safetensors"]
    sources: dict[str, TensorSource] = {}
    for name in files:
        sources.update(read_header(folder / name))
    return sources


def read_tensor(source: TensorSource, dtype: torch.dtype | None = None, device: torch.device | str = "cpu") -> torch.Tensor:
    out = torch.empty(source.shape, dtype=source.dtype)
    if out.numel():
        with source.path.open("rb") as f:
            os.preadv(f.fileno(), [out.view(-1).view(torch.uint8).numpy().data], source.offset)
    if dtype is not None and out.is_floating_point():
        out = out.to(dtype)
    return out.to(device)


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor]) -> int:
    """Write tensors as one safetensors file without an in-memory copy of the whole; returns data bytes."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    cpu = {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}
    for name, t in cpu.items():
        size = t.numel() * t.element_size()
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for t in cpu.values():
            if t.numel():
                f.write(t.view(-1).view(torch.uint8).numpy().data)
    return offset


class StreamedLayers(nn.ModuleList):
    """The decoder's layer list; indexing one layer loads it (and drops the others)."""

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):  # the decoder's own forward slices: loading happens in the pre-hooks
            return nn.ModuleList(list(self._modules.values())[index])
        layer = super().__getitem__(index)
        self.__dict__["streamer"].load(index % len(self))
        return layer


class LayerStreamer:
    """Keeps one decoder layer resident; reads layers from their files and spills changed ones."""

    def __init__(self, layers: nn.ModuleList, prefixes: list[str], sources: dict[str, TensorSource],
                 dtype: torch.dtype, device: torch.device, scratch: Path) -> None:
        self.layers, self.prefixes, self.dtype, self.device, self.scratch = layers, prefixes, dtype, device, scratch
        self.sources = [{name.removeprefix(p): s for name, s in sources.items() if name.startswith(p)} for p in prefixes]
        self.resident: dict[int, dict[str, int]] = {}  # layer -> tensor ids as loaded (to notice changes)
        self.loads = 0

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
                  scratch_dir: str | Path | None = None) -> nn.Module:
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


def save_streamed(model: nn.Module, folder: Path) -> None:
    """Config plus weights as shards: one per decoder layer, one for the rest, and the index."""
    streamer = streamer_of(model)
    assert streamer is not None
    n = len(streamer.layers)
    names = [f"model-{i + 1:05d}-of-{n + 1:05d}.safetensors" for i in range(n + 1)]
    weight_map: dict[str, str] = {}
    total = 0

    def write_layer(i: int) -> int:  # a function: no reference to layer i outlives the loading of layer i + 1
        streamer.load(i)
        tensors = {streamer.prefixes[i] + k: v for k, v in streamer._tensors(i).items()}
        weight_map.update(dict.fromkeys(tensors, names[i]))
        return write_safetensors(folder / names[i], tensors)

    for i in range(n):
        total += write_layer(i)
    streamer.drop(n - 1)
    rest: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    layer_list = streamer.prefixes[0].rsplit(".", 2)[0] + "."
    for name, t in model.state_dict(keep_vars=True).items():
        if not name.startswith(layer_list) and id(t) not in seen:  # a tied head is the embedding: written once
            rest[name] = t
            seen.add(id(t))
    total += write_safetensors(folder / names[n], rest)
    weight_map.update(dict.fromkeys(rest, names[n]))
    (folder / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    hf: Any = model
    hf.config.save_pretrained(folder)
    if getattr(hf, "generation_config", None) is not None:
        hf.generation_config.save_pretrained(folder)


def weights_bytes(folder: str | Path, dtype: torch.dtype = torch.float32) -> int:
    """Bytes the folder's floating-point weights take in `dtype`."""
    size = torch.empty((), dtype=dtype).element_size()
    return sum(int(torch.Size(s.shape).numel()) * (size if s.dtype.is_floating_point else s.dtype.itemsize)
               for s in folder_sources(Path(folder)).values())


def available_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux); elsewhere a large number (never stream by default)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def should_stream(source: str | Path, offload: str, dtype: torch.dtype = torch.float32) -> bool:
    """`offload`: on, off, or auto (stream a local safetensors folder whose weights take over half the free memory)."""
    if offload not in ("auto", "on", "off"):
        raise ValueError(f"offload must be auto, on or off, got {offload!r}")
    folder = Path(source)
    local = folder.is_dir() and ((folder / INDEX_FILE).is_file() or (folder / "model.safetensors").is_file())
    if offload == "on" and not local:
        raise ValueError(f"offload on needs a local folder of safetensors weights; {source} is not one")
    if offload == "off" or not local:
        return False
    return offload == "on" or weights_bytes(folder, dtype) > available_bytes() // 2
