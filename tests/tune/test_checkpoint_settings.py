"""A checkpoint resumes only under the settings it was written with; a setting newer than the
checkpoint counts as unchanged at its default, so an upgrade does not strand a long run."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from gapprune.tune import checkpoint as ckpt
from tests.conftest import tiny_llama


@dataclass
class Record:
    losses: list[float]


def saved_run(folder) -> torch.nn.Module:  # type: ignore[no-untyped-def]
    model = tiny_llama(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=torch.arange(16).view(2, 8)).logits.sum().backward()
    optimizer.step()
    assert ckpt.save(folder, model, optimizer, 7, {"lr": 1e-3, "schedule": "constant"}, Record([1.0]))
    return model


def resume(folder, config, defaults=None) -> tuple[int, torch.nn.Module]:  # type: ignore[no-untyped-def]
    model = tiny_llama(1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return ckpt.resume(folder, model, optimizer, config, frozenset(), Record([]), defaults), model


def test_a_setting_newer_than_the_checkpoint_resumes_at_its_default_only(tmp_path):
    trained = saved_run(tmp_path)
    defaults = {"lr": 1e-4, "schedule": "constant", "decay_fraction": 0.2}
    step, model = resume(tmp_path, {"lr": 1e-3, "schedule": "constant", "decay_fraction": 0.2}, defaults)
    assert step == 7
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), trained.parameters(), strict=True))
    with pytest.raises(ValueError, match=r"other settings \(decay_fraction\)"):
        resume(tmp_path, {"lr": 1e-3, "schedule": "constant", "decay_fraction": 0.5}, defaults)
    with pytest.raises(ValueError, match=r"other settings \(decay_fraction\)"):  # no defaults: any new key differs
        resume(tmp_path, {"lr": 1e-3, "schedule": "constant", "decay_fraction": 0.2})
    with pytest.raises(ValueError, match=r"other settings \(lr\)"):  # a saved setting never falls back to a default
        resume(tmp_path, {"lr": 1e-4, "schedule": "constant", "decay_fraction": 0.2}, defaults)
