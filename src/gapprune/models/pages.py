"""Giving the kernel back the resident pages of weights that surgery replaced.

A model loaded from safetensors is memory-mapped: each weight reads its bytes from the file's pages,
which count in the process's resident memory once read. Surgery builds a smaller copy of every pruned
projection, but dropping the old tensor does not unmap its pages (the file's mapping lives on), so
before this the old and the new weights were resident together: applying a 1.5B plan in float32
peaked at 8.2 GB in surgery, and at 6.6 GB (set by the calibration pass) once the old pages were
handed back. `release_file_pages` asks the kernel to reclaim the pages wholly inside a
tensor's bytes (`madvise(MADV_PAGEOUT)`), only where they map a file. Reclaiming never loses data:
a clean file page that is read again comes back from the file with the same bytes, and a page this
process wrote is kept (or swapped), never discarded.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import sys
from collections.abc import Callable, Iterable

import torch

MADV_PAGEOUT = 21  # Linux ≥ 5.4; older kernels answer EINVAL and keep the pages


def release_file_pages(tensors: Iterable[torch.Tensor]) -> int:
    """Reclaim the file-backed pages of `tensors` (CPU, contiguous); returns the bytes asked back."""
    madvise = _madvise()
    if madvise is None:
        return 0
    page, released = mmap.PAGESIZE, 0
    for tensor in tensors:
        if tensor.device.type != "cpu" or not tensor.is_contiguous() or tensor.numel() == 0:
            continue
        start = tensor.data_ptr()
        low = -(-start // page) * page  # whole pages only: the edges may hold a neighbour's bytes
        high = (start + tensor.numel() * tensor.element_size()) // page * page
        if high > low and _maps_a_file(low, high) and madvise(low, high - low, MADV_PAGEOUT) == 0:
            released += high - low
    return released


def _maps_a_file(low: int, high: int) -> bool:
    """Whether [low, high) lies inside one mapping of a file (`/proc/self/maps` names a path)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            begin, end = (int(x, 16) for x in fields[0].split("-"))
            if begin <= low < end:
                return high <= end and len(fields) == 6 and fields[5].startswith("/")
    return False


@functools.cache
def _madvise() -> Callable[[int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise  # type: ignore[no-any-return]
