"""Safetensors files read and written by hand: headers, one tensor at a time (`os.preadv`), shards."""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

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


def corrupt(path: Path, why: str) -> ValueError:
    return ValueError(f"{path} is corrupt or truncated ({why}); re-export or re-download it")


def read_header(path: Path) -> dict[str, TensorSource]:
    """The tensors of one safetensors file (8-byte header length, JSON header, then raw data).

    The header is checked against the file's size: a streamed model reads each tensor later, one at
    a time, and a short file would otherwise hand back uninitialised memory for the missing bytes.
    """
    if not path.is_file():
        raise ValueError(f"{path} is missing (a weights file the model folder needs); re-export or re-download it")
    size = path.stat().st_size
    with path.open("rb") as f:
        prefix = f.read(8)
        if len(prefix) < 8:
            raise corrupt(path, f"{size} bytes, shorter than a safetensors header")
        (length,) = struct.unpack("<Q", prefix)
        if 8 + length > size:
            raise corrupt(path, f"its header claims {length:,} bytes, the file has {size:,}")
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise corrupt(path, f"its header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise corrupt(path, "its header is not a JSON object")
    header.pop("__metadata__", None)
    sources = {}
    for name, info in header.items():
        try:
            dtype, shape, (start, end) = _DTYPES[info["dtype"]], tuple(info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError) as e:
            raise corrupt(path, f"tensor {name!r} has an unreadable entry ({e!r})") from None
        if end - start != math.prod(shape) * dtype.itemsize or 8 + length + end > size:
            raise corrupt(path, f"tensor {name!r} ends at byte {8 + length + end:,} of {size:,}")
        sources[name] = TensorSource(path, 8 + length + start, dtype, shape)
    return sources


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
            got = os.preadv(f.fileno(), [out.view(-1).view(torch.uint8).numpy().data], source.offset)
        if got != out.numel() * out.element_size():  # the file shrank after its header was read
            raise corrupt(source.path, f"read {got:,} of {out.numel() * out.element_size():,} bytes at {source.offset:,}")
    if dtype is not None and out.is_floating_point():
        out = out.to(dtype)
    return out.to(device)


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor]) -> int:
    """Write tensors as one safetensors file without an in-memory copy of the whole; returns data bytes."""
    cpu = {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}
    layout = {name: (t.dtype, tuple(t.shape)) for name, t in cpu.items()}
    return _write(path, layout, lambda name: cpu[name])


def convert_safetensors(path: Path, sources: dict[str, TensorSource], dtype: torch.dtype) -> int:
    """Copy tensors into one safetensors file with their floating-point ones cast to `dtype`.

    One tensor is read, cast and written at a time, so converting a model holds one tensor, not
    the whole converted model (a 70B float32 checkpoint would otherwise need 140 GB for bf16).
    """
    def target(source: TensorSource) -> torch.dtype:
        return dtype if source.dtype.is_floating_point else source.dtype

    layout = {name: (target(source), source.shape) for name, source in sources.items()}
    return _write(path, layout, lambda name: read_tensor(sources[name], dtype))


def _write(path: Path, layout: dict[str, tuple[torch.dtype, tuple[int, ...]]],
           tensor: Callable[[str], torch.Tensor]) -> int:
    """The header from dtypes and shapes, then each tensor's bytes as `tensor(name)` produces them."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in layout.items():
        size = math.prod(shape) * dtype.itemsize
        header[name] = {"dtype": _NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, (dtype, shape) in layout.items():
            if math.prod(shape):
                t = tensor(name).contiguous()
                if t.dtype != dtype or tuple(t.shape) != shape:
                    raise AssertionError(f"{name}: produced {t.dtype} {tuple(t.shape)}, header says {dtype} {shape}")
                f.write(t.view(-1).view(torch.uint8).numpy().data)
                del t  # before the next tensor is produced
    return offset
