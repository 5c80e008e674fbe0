"""Surgery hands back the memory-mapped pages of the weights it replaces, and no byte changes."""

from __future__ import annotations

import sys

import pytest
import torch

from gapprune.models.pages import release_file_pages

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and /proc are Linux's")


def file_rss_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("RssFile"))


def test_a_memory_mapped_tensor_leaves_resident_memory_and_reads_back_the_same_bytes(tmp_path):
    values = torch.randn(8 << 18)  # 8 MB
    path = tmp_path / "weights.bin"
    path.write_bytes(values.numpy().tobytes())
    mapped = torch.from_file(str(path), shared=False, size=values.numel(), dtype=torch.float32)  # a private map, as safetensors
    assert torch.equal(mapped, values)  # every page read: resident
    before = file_rss_mb()
    released = release_file_pages([mapped])
    assert released >= values.numel() * 4 - 2 * 4096  # all but the partial pages at the edges
    assert file_rss_mb() <= before - 6
    assert torch.equal(mapped, values)  # read again from the file


def test_anonymous_memory_and_written_pages_are_left_alone(tmp_path):
    anonymous = torch.randn(1 << 20)
    assert release_file_pages([anonymous]) == 0
    path = tmp_path / "w.bin"
    values = torch.arange(1 << 20, dtype=torch.float32)
    path.write_bytes(values.numpy().tobytes())
    mapped = torch.from_file(str(path), shared=False, size=values.numel(), dtype=torch.float32)
    mapped.mul_(2)  # copy-on-write pages of this process: reclaiming must keep them
    release_file_pages([mapped])
    assert torch.equal(mapped, values * 2)
