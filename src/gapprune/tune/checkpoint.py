"""Resumable training checkpoints: the trained tensors, the optimiser, the RNG and the record so far.

One `state.pt` written to a temporary name and renamed, so a kill during a save leaves the previous
checkpoint whole; `trainer_state.json` beside it is for people (step, config, losses so far).
Only trained tensors are stored: LoRA adapters, or every parameter when all of them train.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)

STATE = "state.pt"


def trained_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors that train: every parameter with requires_grad (tied weights once)."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def save(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer, step: int, config: dict[str, Any],
         record: Any) -> None:
    """Write the checkpoint of `step` atomically."""
    folder.mkdir(parents=True, exist_ok=True)
    state = {
        "step": step, "config": config, "record": asdict(record), "params": trained_state(model),
        "optimizer": optimizer.state_dict(), "rng": torch.get_rng_state(),
    }
    tmp = folder / (STATE + ".tmp")
    torch.save(state, tmp)
    tmp.replace(folder / STATE)
    (folder / "trainer_state.json").write_text(json.dumps({"step": step, "config": config}, indent=1) + "\n")


def resume(folder: Path | None, model: nn.Module, optimizer: torch.optim.Optimizer, config: dict[str, Any],
           may_change: frozenset[str], record: Any) -> int:
    """Load the checkpoint in `folder` into model, optimiser, RNG and `record`; returns its step (0: none).

    Refuses a checkpoint written with other training settings (only `may_change` may differ).
    """
    if folder is None or not (folder / STATE).is_file():
        return 0
    state = torch.load(folder / STATE, weights_only=False)
    changed = sorted(k for k in set(config) | set(state["config"])
                     if k not in may_change and config.get(k) != state["config"].get(k))
    if changed:
        raise ValueError(f"the checkpoint in {folder} was written with other settings ({', '.join(changed)}); "
                         "pass the same settings, or another checkpoint folder to start afresh")
    params = dict(model.named_parameters())
    missing = sorted(set(state["params"]) ^ {n for n, p in params.items() if p.requires_grad})
    if missing:
        raise ValueError(f"the checkpoint in {folder} does not fit this model ({missing[:3]} ...)")
    with torch.no_grad():
        for name, value in state["params"].items():
            params[name].copy_(value)
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])
    for f in fields(record):
        setattr(record, f.name, state["record"][f.name])
    log.info("resuming at step %d from %s", state["step"], folder)
    return int(state["step"])
