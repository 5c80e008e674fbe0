"""The dequantized copy of a GGUF file is keyed by the file's content, so new environments share it."""

import os
import shutil
from pathlib import Path

from gapprune.models.loading import CONTENT_SAMPLE_BYTES, _gguf_cache_folder


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_the_same_file_installed_twice_maps_to_one_cache_folder(tmp_path):
    data = os.urandom(3 * CONTENT_SAMPLE_BYTES)
    first = write(tmp_path / "venv-a" / "m.gguf", data)
    second = tmp_path / "venv-b" / "m.gguf"
    second.parent.mkdir()
    shutil.copyfile(first, second)
    os.utime(second, (1, 1))  # an install time years apart
    assert _gguf_cache_folder(first, tmp_path / "cache") == _gguf_cache_folder(second, tmp_path / "cache")


def test_a_file_whose_end_or_size_differs_maps_elsewhere(tmp_path):
    data = os.urandom(3 * CONTENT_SAMPLE_BYTES)
    original = _gguf_cache_folder(write(tmp_path / "a" / "m.gguf", data), tmp_path)
    changed_end = _gguf_cache_folder(write(tmp_path / "b" / "m.gguf", data[:-1] + bytes([data[-1] ^ 1])), tmp_path)
    longer = _gguf_cache_folder(write(tmp_path / "c" / "m.gguf", data + b"\0"), tmp_path)
    tiny = _gguf_cache_folder(write(tmp_path / "d" / "m.gguf", b"GGUF"), tmp_path)
    assert len({original, changed_end, longer, tiny}) == 4
    assert original.name.startswith("m-")
