"""The offload policy: whether a model is streamed (`offload` on, off or auto by free memory)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from gapprune.config import TOKEN_ROWS_FACTOR
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


def cache_bytes(folder: str | Path, tokens: int = 4096) -> int:
    """The cached layer inputs of `tokens` calibration tokens (float32, one per layer plus the final
    one): held in host memory wherever the model runs."""
    config = _text_config(folder)
    return (int(config["num_hidden_layers"]) + 1) * tokens * int(config["hidden_size"]) * 4


def working_bytes(folder: str | Path, tokens: int = 4096) -> int:
    """What a prune holds besides the weights, estimated from config.json: the cached layer inputs
    (`cache_bytes`) and one layer's working set (its two output projections' Grams on two halves,
    float32, and the OBS workspace, float32, for the wider one; a projection wider than four times a
    half's tokens holds rows instead, `TokenGram`). Nothing here grows with depth except the cache
    (`calibrate/gram.py` holds one layer's Grams)."""
    return cache_bytes(folder, tokens) + layer_work_bytes(folder, tokens)


def layer_work_bytes(folder: str | Path, tokens: int = 4096) -> int:
    """One layer's Grams and OBS workspace (see `working_bytes`): on the device, beside the weights."""
    config = _text_config(folder)
    hidden = int(config["hidden_size"])
    head_dim = int(config.get("head_dim") or hidden // int(config["num_attention_heads"]))
    widths = [int(config["num_attention_heads"]) * head_dim, int(config["intermediate_size"])]
    half = tokens // 2

    def one_gram(width: int) -> int:  # bytes of one half's Gram, as `gram_observer` chooses its form
        return (half if half * TOKEN_ROWS_FACTOR <= width else width) * width * 4

    grams = sum(2 * one_gram(w) for w in widths)
    obs = 3 * 2 * one_gram(max(widths))  # the summed Gram, its damped copy and Cholesky factor, the inverse
    return grams + obs


def _text_config(folder: str | Path) -> dict:
    config = json.loads((Path(folder) / "config.json").read_text())
    return dict(config.get("text_config", config))


def device_free_bytes(device: str) -> int:
    """Free memory where the weights will live: the GPU's for a CUDA device, else the host's."""
    if device.startswith("cuda"):
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    return available_bytes()


def should_stream(source: str | Path, offload: str, dtype: torch.dtype = torch.float32, tokens: int = 4096,
                  device: str = "cpu") -> bool:
    """`offload`: on, off, or auto: stream a local safetensors folder when the whole run's need is over
    half the free memory where it would live (`memory_need`)."""
    if offload not in ("auto", "on", "off"):
        raise ValueError(f"offload must be auto, on or off, got {offload!r}")
    folder = Path(source)
    local = folder.is_dir() and ((folder / INDEX_FILE).is_file() or (folder / "model.safetensors").is_file())
    if offload == "on" and not local:
        raise ValueError(f"offload on needs a local folder of safetensors weights; {source} is not one")
    if offload == "off" or not local:
        return False
    if offload == "on":
        return True
    need, free = memory_need(folder, dtype, tokens, device)
    return need > free // 2


def memory_need(folder: str | Path, dtype: torch.dtype = torch.float32, tokens: int = 4096,
                device: str = "cpu") -> tuple[int, int]:
    """(bytes the run needs, bytes free) where the weights would live. On a CPU: the weights in `dtype`
    plus `working_bytes` for `tokens` calibration tokens, against the host's free memory; on a GPU the
    weights plus one layer's working set against the GPU's (the cached inputs stay in host memory)."""
    on_device = weights_bytes(folder, dtype) + layer_work_bytes(folder, tokens)
    if device.startswith("cuda"):
        return on_device, device_free_bytes(device)
    return on_device + cache_bytes(folder, tokens), available_bytes()


def auto_stream_warning(folder: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> str:
    """Why `auto` streams (the need against the free memory), what it costs, and how to keep the model whole."""
    need, free = memory_need(folder, dtype, device=device)
    return (f"offload auto: the run needs about {need / 2**30:.1f} GiB, over half of the {free / 2**30:.1f} GiB free, "
            f"so the decoder layers of {folder} are read from disk one at a time and profiled exactly in one "
            "layer-major pass (slower than in memory, where the auto profiler replays only the options that can "
            "change the plan); free memory or pass --offload off to keep the model in memory")
