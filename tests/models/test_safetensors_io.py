"""Hand-written safetensors files: readable by the `safetensors` library, and a dtype conversion that
holds one tensor at a time."""

from __future__ import annotations

import gc
import weakref

import torch
from safetensors.torch import load_file, save_file

from gapprune.models.streaming import safetensors_io
from gapprune.models.streaming.safetensors_io import convert_safetensors, read_header, write_safetensors


def sample_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"a.weight": torch.randn(7, 5, generator=g), "b.bias": torch.randn(3, generator=g),
            "ids": torch.arange(6, dtype=torch.int64).view(2, 3), "empty": torch.zeros(0, 4)}


def test_written_files_load_in_the_safetensors_library(tmp_path):
    tensors = sample_tensors()
    write_safetensors(tmp_path / "m.safetensors", tensors)
    loaded = load_file(tmp_path / "m.safetensors")
    assert loaded.keys() == tensors.keys()
    for name, t in tensors.items():
        assert loaded[name].dtype == t.dtype and torch.equal(loaded[name], t), name


def test_conversion_casts_floats_keeps_integers_and_holds_one_tensor_at_a_time(tmp_path, monkeypatch):
    tensors = sample_tensors()
    save_file(tensors, tmp_path / "f32.safetensors")
    produced: list[weakref.ref[torch.Tensor]] = []
    read = safetensors_io.read_tensor

    def read_and_check_the_previous_ones_are_gone(source, dtype=None, device="cpu"):
        gc.collect()
        assert all(ref() is None for ref in produced), "a converted tensor outlived its write"
        out = read(source, dtype, device)
        produced.append(weakref.ref(out))
        return out

    monkeypatch.setattr(safetensors_io, "read_tensor", read_and_check_the_previous_ones_are_gone)
    convert_safetensors(tmp_path / "bf16.safetensors", read_header(tmp_path / "f32.safetensors"), torch.bfloat16)
    assert len(produced) == 3  # the empty tensor has no bytes to read
    loaded = load_file(tmp_path / "bf16.safetensors")
    for name, t in tensors.items():
        expected = t.to(torch.bfloat16) if t.is_floating_point() else t
        assert loaded[name].dtype == expected.dtype and torch.equal(loaded[name], expected), name
