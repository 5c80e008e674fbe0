"""The teacher's top-k outputs on disk, for training text that is seen more than once.

On the fly, one teacher forward costs about a third of a student step (SmolLM2 at 25%), more for a
heavily pruned student. When the same windows come back (several epochs over a small text of your
own, or several students, say two ratios, distilled from one teacher on the same text) the cache
answers them without the teacher: the top-k log-probabilities (float32) and token ids (int32) of
every position, written the first time a window is used.

The answers are the ones the teacher gives on the fly: a micro-batch with any window missing runs
the teacher on the whole micro-batch, as an uncached run would, and only then stores the missing
rows; a window is marked done after its rows are on disk, so a killed run leaves no half-written
entry. The folder is keyed by the teacher, its dtype, k, the temperature and the windows' tokens.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch
from transformers import PreTrainedModel

from gapprune.tune.kd_loss import teacher_topk


class TeacherTopK:
    """Top-k teacher outputs of `windows` (n, T), kept under `root`, filled on first use."""

    def __init__(self, root: Path, windows: torch.Tensor, *, teacher_id: str, teacher_dtype: torch.dtype, k: int,
                 temperature: float) -> None:
        if k <= 0:
            raise ValueError("the teacher cache stores the teacher's top-k outputs: set top_k > 0 (e.g. 64)")
        self.k, self.temperature = k, temperature
        n, length = windows.shape
        digest = hashlib.sha256(json.dumps([teacher_id, str(teacher_dtype), k, temperature, [n, length]]).encode())
        digest.update(windows.to(torch.int64).numpy().tobytes())
        self.folder = Path(root) / digest.hexdigest()[:16]
        if not self.folder.is_dir():
            _create(self.folder, n, length, k, {"teacher": teacher_id, "dtype": str(teacher_dtype), "k": k,
                                               "temperature": temperature, "windows": n, "seq_len": length})
        self._logp = np.memmap(self.folder / "logp.f32", dtype=np.float32, mode="r+", shape=(n, length, k))
        self._ids = np.memmap(self.folder / "ids.i32", dtype=np.int32, mode="r+", shape=(n, length, k))
        self._done = np.memmap(self.folder / "done.u8", dtype=np.uint8, mode="r+", shape=(n,))
        self.hits = self.misses = 0  # micro-batches answered from disk / by the teacher

    def outputs(self, teacher: PreTrainedModel, index: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probabilities (b, T, k), token ids (b, T, k)) of windows `index` (b,), whose tokens are `ids`."""
        rows = index.tolist()
        missing = [i for i, row in enumerate(rows) if not self._done[row]]
        if not missing:
            self.hits += 1
            return torch.from_numpy(np.array(self._logp[rows])), torch.from_numpy(np.array(self._ids[rows], dtype=np.int64))
        self.misses += 1
        with torch.no_grad():
            logp, top = teacher_topk(teacher(input_ids=ids).logits, self.k, self.temperature)
        targets = [rows[i] for i in missing]
        self._logp[targets] = logp[missing].cpu().numpy()
        self._ids[targets] = top[missing].to(torch.int32).cpu().numpy()
        self._logp.flush()
        self._ids.flush()
        self._done[targets] = 1
        self._done.flush()
        return logp, top

    @property
    def windows_done(self) -> int:
        return int(self._done.sum())


def _create(folder: Path, n: int, length: int, k: int, meta: dict[str, object]) -> None:
    """Make the empty cache beside `folder`, then rename it into place (another process may win the race).

    The files get their disk blocks now: a full disk is a clear error here, not a crash (SIGBUS) at
    the first write into a sparse memory-mapped file an hour into training.
    """
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    files = (("logp.f32", 4 * n * length * k), ("ids.i32", 4 * n * length * k), ("done.u8", n))
    try:
        for name, size in files:
            with open(tmp / name, "wb") as f:
                _allocate(f, size, name, folder.parent)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        os.rename(tmp, folder)
    except OSError:
        if not folder.is_dir():  # else another process made the same cache first
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _allocate(f: BinaryIO, size: int, name: str, where: Path) -> None:
    """Give `f` `size` bytes of disk now; where the system cannot, leave it sparse."""
    if not hasattr(os, "posix_fallocate"):  # macOS
        f.truncate(size)
        return
    try:
        os.posix_fallocate(f.fileno(), 0, size)
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise OSError(errno.ENOSPC, f"the teacher cache needs {size / 2**20:,.0f} MB for {name} in {where}; free "
                          "disk space there, point --teacher-cache at another folder, or lower --top-k") from error
        if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        f.truncate(size)
