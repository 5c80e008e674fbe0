"""Hand-written safetensors files: readable by the `safetensors` library, and a dtype conversion that
holds one tensor at a time."""

from __future__ import annotations

import gc
import json
import weakref

import pytest
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


def _damaged(tmp_path, how: str):
    path = tmp_path / "m.safetensors"
    write_safetensors(path, sample_tensors())
    raw = path.read_bytes()
    damaged = {"truncated": raw[:-8], "empty": b"", "short": raw[:5], "header_beyond_file": raw[:40],
               "not_json": raw[:8] + b"\xff" * (len(raw) - 8)}[how]
    path.write_bytes(damaged)
    return path


@pytest.mark.parametrize("how", ["truncated", "empty", "short", "header_beyond_file", "not_json"])
def test_a_damaged_file_is_refused_when_its_header_is_read(tmp_path, how):
    with pytest.raises(ValueError, match="corrupt or truncated .*re-download"):
        read_header(_damaged(tmp_path, how))


def test_a_file_that_shrinks_after_its_header_is_refused_when_a_tensor_is_read(tmp_path):
    path = tmp_path / "m.safetensors"
    write_safetensors(path, sample_tensors())
    sources = read_header(path)
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(ValueError, match="corrupt or truncated"):
        safetensors_io.read_tensor(sources["ids"])  # the last tensor written, now short


def test_a_shard_missing_from_a_folder_is_named(tmp_path):
    write_safetensors(tmp_path / "model-00001-of-00002.safetensors", sample_tensors())
    (tmp_path / safetensors_io.INDEX_FILE).write_text(json.dumps({"weight_map": {
        "a.weight": "model-00001-of-00002.safetensors", "b.bias": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(ValueError, match="model-00002-of-00002.safetensors is missing"):
        safetensors_io.folder_sources(tmp_path)


def test_a_truncated_checkpoint_is_refused_by_a_streamed_prune(tiny_model_folder, tmp_path, capsys):
    """Streaming reads tensors one at a time, long after loading: a short file must not become garbage weights."""
    import shutil

    from gapprune.cli import main

    folder, text = tiny_model_folder
    damaged = tmp_path / "damaged"
    shutil.copytree(folder, damaged)
    weights = damaged / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    argv = ["prune", str(damaged), "--ratio", "0.2", "--out", str(tmp_path / "out"), "--calib", str(text),
            "--calib-samples", "4", "--profile-samples", "4", "--seq-len", "32", "--channel-step", "32", "--no-plots",
            "--offload", "on"]
    assert main(argv) == 2
    assert "corrupt or truncated" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
