"""The offload policy: whether a model is streamed (`offload` on, off or auto by free memory)."""

from __future__ import annotations

from pathlib import Path

import torch

from gapprune.models.streaming.safetensors_io import INDEX_FILE, folder_sources


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
