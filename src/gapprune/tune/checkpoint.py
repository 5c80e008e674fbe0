"""Resumable training checkpoints: the trained tensors, the optimiser, the RNG and the record so far.

One `state.pt` written to a temporary name and renamed, so a kill during a save leaves the previous
checkpoint whole; `trainer_state.json` beside it is for people (step, config, losses so far).
Only trained tensors are stored: LoRA adapters, or every parameter when all of them train.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)

STATE = "state.pt"
PEOPLE_STATE = "trainer_state.json"
OWN_FILES = (STATE, STATE + ".tmp", PEOPLE_STATE)  # everything a checkpoint folder holds, and all `remove` deletes


def check_folder(folder: Path, *, apart_from: dict[str, Path]) -> None:
    """Refuse a checkpoint folder that tuning would write over or later delete by mistake.

    It must not be, contain or lie inside another folder of the run (`apart_from`: flag -> path, e.g. the
    output or the model), and if it exists it must hold nothing but a checkpoint's own files.
    """
    here = folder.resolve()
    for flag, other in apart_from.items():
        there = other.resolve()
        if here == there or here in there.parents or there in here.parents:
            raise ValueError(f"--checkpoint-dir {folder} overlaps {flag} {other}; choose a folder of its own "
                             f"(the default is OUT.ckpt)")
    if folder.is_dir():
        foreign = sorted(p.name for p in folder.iterdir() if p.name not in OWN_FILES)
        if foreign:
            raise ValueError(f"--checkpoint-dir {folder} holds files that are not a gapprune checkpoint "
                             f"({', '.join(foreign[:3])}{' ...' if len(foreign) > 3 else ''}); choose an empty or "
                             "new folder")


def remove(folder: Path) -> None:
    """Delete a finished run's checkpoint: its own files, then the folder if that left it empty."""
    for name in OWN_FILES:
        (folder / name).unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:  # absent, or someone put other files there during the run: leave them
        pass


def trained_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The tensors that train: every parameter with requires_grad (tied weights once)."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """About what a checkpoint takes on disk: the trained tensors and the optimiser's."""
    tensors: list[torch.Tensor] = [p for p in model.parameters() if p.requires_grad]
    tensors += [t for per in optimizer.state.values() for t in per.values() if isinstance(t, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def save(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer, step: int, config: dict[str, Any],
         record: Any) -> bool:
    """Write the checkpoint of `step` atomically; returns whether it was written.

    A checkpoint that does not fit on the disk is skipped with a warning (the previous one stays),
    not raised: losing the training done so far to a full disk would cost more than one checkpoint.
    """
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (STATE + ".tmp")
    needed, free = state_bytes(model, optimizer), shutil.disk_usage(folder).free
    if needed > free:
        log.warning("checkpoint of step %d skipped: it needs about %.1f GiB in %s, %.1f GiB are free; free space or "
                    "choose another checkpoint folder to keep runs resumable", step, needed / 2**30, folder, free / 2**30)
        return False
    state = {
        "step": step, "config": config, "record": asdict(record), "params": trained_state(model),
        "optimizer": optimizer.state_dict(), "rng": torch.get_rng_state(),
    }
    try:
        torch.save(state, tmp)
    except (OSError, RuntimeError) as err:  # the disk filled while writing: keep the previous checkpoint
        tmp.unlink(missing_ok=True)
        log.warning("checkpoint of step %d not written to %s (%s); the previous one stays", step, folder, err)
        return False
    tmp.replace(folder / STATE)
    (folder / PEOPLE_STATE).write_text(json.dumps({"step": step, "config": config}, indent=1) + "\n")
    return True


def resume(folder: Path | None, model: nn.Module, optimizer: torch.optim.Optimizer, config: dict[str, Any],
           may_change: frozenset[str], record: Any, defaults: dict[str, Any] | None = None) -> int:
    """Load the checkpoint in `folder` into model, optimiser, RNG and `record`; returns its step (0: none).

    Refuses a checkpoint written with other training settings (only `may_change` may differ). A
    setting newer than the checkpoint counts as unchanged at its default (`defaults`): the run that
    wrote it trained as that default does, so an upgrade does not strand a long run.
    """
    if folder is None or not (folder / STATE).is_file():
        return 0
    state = torch.load(folder / STATE, weights_only=False)
    saved = {**{k: v for k, v in (defaults or {}).items() if k in config}, **state["config"]}
    changed = sorted(k for k in set(config) | set(saved)
                     if k not in may_change and config.get(k) != saved.get(k))
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
    for f in fields(record):  # a field newer than the checkpoint keeps its default
        setattr(record, f.name, state["record"].get(f.name, getattr(record, f.name)))
    log.info("resuming at step %d from %s", state["step"], folder)
    return int(state["step"])
