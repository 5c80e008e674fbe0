"""Saving a streamed model layer by layer as sharded safetensors with an index."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gapprune.models.streaming.safetensors_io import INDEX_FILE, write_safetensors
from gapprune.models.streaming.streamer import streamer_of


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
