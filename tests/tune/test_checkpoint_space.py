"""A checkpoint that does not fit on the disk is skipped, not raised: the training done so far survives."""

from __future__ import annotations

import shutil
from collections import namedtuple
from dataclasses import dataclass

import torch

from gapprune.tune import checkpoint as ckpt
from tests.conftest import tiny_llama


@dataclass
class Record:
    losses: list[float]


def trained_a_step() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = tiny_llama(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=torch.arange(16).view(2, 8)).logits.sum().backward()
    optimizer.step()
    return model, optimizer


def test_a_full_disk_skips_the_checkpoint_and_keeps_the_previous(tmp_path, monkeypatch, caplog):
    model, optimizer = trained_a_step()
    assert ckpt.save(tmp_path, model, optimizer, 1, {"lr": 1e-3}, Record([1.0]))
    first = (tmp_path / ckpt.STATE).read_bytes()
    assert ckpt.state_bytes(model, optimizer) >= 3 * sum(p.numel() * 4 for p in model.parameters())  # weights + Adam

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(10**6, 10**6, 1024))
    assert not ckpt.save(tmp_path, model, optimizer, 2, {"lr": 1e-3}, Record([1.0, 0.5]))
    assert "checkpoint of step 2 skipped" in caplog.text and "GiB are free" in caplog.text
    assert (tmp_path / ckpt.STATE).read_bytes() == first and not (tmp_path / (ckpt.STATE + ".tmp")).exists()
