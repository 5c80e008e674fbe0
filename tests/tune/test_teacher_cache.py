"""The teacher's top-k on disk: the same training as on the fly, without the teacher once a window is stored."""

from __future__ import annotations

import copy

import pytest
import torch

from gapprune.tune import DistillConfig, distill
from gapprune.tune.teacher_cache import TeacherTopK
from tests.tune.helpers import teacher_and_student, text_file


class WindowCounter:
    """Counts the windows a model is asked about (a forward pre-hook)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.windows = 0
        self.handle = model.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs):  # type: ignore[no-untyped-def]
        self.windows += kwargs["input_ids"].shape[0]


def config(tmp_path, **changes) -> DistillConfig:  # type: ignore[no-untyped-def]
    settings = {"data": text_file(tmp_path), "seq_len": 32, "batch_size": 4, "micro_batch": 2, "epochs": 2.0,
                "val_windows": 0, "params": "all", "lr": 3e-3, "top_k": 8, "warmup": 1}
    return DistillConfig(**{**settings, **changes})


def test_cached_top_k_trains_exactly_as_the_teacher_on_the_fly_and_asks_it_once_per_window(tmp_path):
    teacher, student, tokenizer = teacher_and_student()
    live = WindowCounter(teacher)
    on_the_fly, live_result = distill(copy.deepcopy(student), tokenizer, config(tmp_path), teacher=teacher,
                                      teacher_tokenizer=tokenizer)
    live.handle.remove()
    cached_teacher = WindowCounter(teacher)
    cached, cached_result = distill(copy.deepcopy(student), tokenizer,
                                    config(tmp_path, teacher_cache=str(tmp_path / "topk")),
                                    teacher=teacher, teacher_tokenizer=tokenizer)
    cached_teacher.handle.remove()
    assert cached_result.train_loss == live_result.train_loss
    for (name, a), (_, b) in zip(on_the_fly.state_dict().items(), cached.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    micro_batches = 2 * live_result.steps
    assert live.windows == 2 * micro_batches
    # Epoch 2 reads the disk; each epoch drops a different remainder of the shuffled windows,
    # so a few windows are first met after epoch 1.
    assert cached_teacher.windows == 2 * (micro_batches - cached_result.cache_hits)
    assert cached_teacher.windows < 0.6 * live.windows
    # A second student on the same text (another ratio, say) needs no teacher at all.
    again = WindowCounter(teacher)
    _, again_result = distill(copy.deepcopy(student), tokenizer, config(tmp_path, teacher_cache=str(tmp_path / "topk")),
                              teacher=teacher, teacher_tokenizer=tokenizer)
    assert again.windows == 0 and again_result.train_loss == live_result.train_loss


def test_a_window_is_marked_done_only_with_its_rows_and_the_key_includes_k(tmp_path):
    teacher, _, _ = teacher_and_student()
    windows = torch.randint(0, 200, (6, 16))
    cache = TeacherTopK(tmp_path, windows, teacher_id="tiny", teacher_dtype=torch.float32, k=4, temperature=1.0)
    logp, ids = cache.outputs(teacher, torch.tensor([1, 4]), windows[[1, 4]])
    assert cache.windows_done == 2 and cache.misses == 1
    reopened = TeacherTopK(tmp_path, windows, teacher_id="tiny", teacher_dtype=torch.float32, k=4, temperature=1.0)
    again_logp, again_ids = reopened.outputs(teacher, torch.tensor([1, 4]), windows[[1, 4]])
    assert reopened.hits == 1 and torch.equal(again_logp, logp) and torch.equal(again_ids, ids)
    other_k = TeacherTopK(tmp_path, windows, teacher_id="tiny", teacher_dtype=torch.float32, k=5, temperature=1.0)
    assert other_k.folder != cache.folder and other_k.windows_done == 0


def test_the_cache_needs_top_k(tmp_path):
    with pytest.raises(ValueError, match="top_k"):
        DistillConfig(teacher_cache=str(tmp_path))


def test_a_full_disk_is_a_clear_error_at_the_start_and_leaves_nothing_behind(tmp_path, monkeypatch):
    import errno
    import os

    def no_space(fd: int, offset: int, size: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space, raising=False)
    windows = torch.randint(0, 200, (6, 16))
    with pytest.raises(OSError, match="teacher cache needs .* MB .*--teacher-cache"):
        TeacherTopK(tmp_path / "topk", windows, teacher_id="tiny", teacher_dtype=torch.float32, k=4, temperature=1.0)
    assert list((tmp_path / "topk").iterdir()) == []
