"""What the SmolLM2 benchmarks do alike: parse the shared flags, calibrate with the shared settings,
reuse one dense profile, and "copy the dense model, apply a plan, measure perplexity".

Every benchmark that compares plans calibrates with `bench_config` and reuses one profile folder
(`settings.PROFILE`), so their loss tables, scores and signals are the same numbers.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from settings import CALIBRATION, MODEL, PROFILE, Window
from torch import nn
from transformers import PreTrainedTokenizerBase

from gapprune.api import load, pruned_copy, write_profile_folder
from gapprune.calibrate.gram import GramStats
from gapprune.config import PruneConfig
from gapprune.evaluate.perplexity import PerplexityResult, evaluate_ppl
from gapprune.pipeline import Calibration, Profile, calibrate, profile_model
from gapprune.prune.plan import Plan


def parser(description: str | None, out: str) -> argparse.ArgumentParser:
    """--model, --data-dir and --out, with the shared defaults."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=MODEL)
    p.add_argument("--data-dir", default=None, help="data folder (else $GAPPRUNE_DATA, else the hub)")
    p.add_argument("--out", default=out)
    return p


def add_profile_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", default=PROFILE, help="dense profile folder: reused when it exists, else written")


def bench_config(data_dir: str | None, **overrides: Any) -> PruneConfig:
    """The benchmarks' pruning settings; `ratio` and `allocator` are per plan, not part of the profile."""
    return PruneConfig(**{"ratio": 0.25, "allocator": "gap", "compensate": "none", "data_dir": data_dir,
                          **CALIBRATION, **overrides})


def calibrate_and_profile(model: nn.Module, tokenizer: PreTrainedTokenizerBase, config: PruneConfig,
                          folder: str | Path) -> tuple[Calibration, Profile, bool]:
    """The dense calibration (for Gram statistics and refinement) and the shared profile.

    The profile is read from `folder` when it exists (it must match the model and settings), else
    measured and saved there. The flag says whether it was measured now.
    """
    calibration = calibrate(model, tokenizer, config)
    if Path(folder).exists():
        profile = Profile.load(folder)
        profile.check_matches(calibration, config)
        return calibration, profile, False
    profile = profile_model(calibration, config)
    write_profile_folder(folder, profile)
    return calibration, profile, True


def perplexities(model: nn.Module, tokenizer: PreTrainedTokenizerBase, windows: Iterable[Window],
                 data_dir: str | None, progress: bool = True) -> list[tuple[Window, PerplexityResult]]:
    return [(w, evaluate_ppl(model, tokenizer, w.dataset, split=w.split, seq_len=w.seq_len, max_windows=w.windows,
                             data_dir=data_dir, progress=progress)) for w in windows]


def evaluate_plan(dense: nn.Module, tokenizer: PreTrainedTokenizerBase, plan: Plan, windows: Iterable[Window],
                  data_dir: str | None, *, compensate: str = "none", gram: GramStats | None = None, ridge: float = 1.0,
                  progress: bool = True) -> tuple[dict[str, Any], list[tuple[Window, PerplexityResult]]]:
    """Prune a copy of `dense` by `plan`, measure its perplexities, drop the copy.

    Returns the surgery summary (compensation counts and `wall_s`) and one result per window spec.
    """
    pruned, summary = pruned_copy(dense, plan, compensate, gram, ridge)
    results = perplexities(pruned, tokenizer, windows, data_dir, progress)
    del pruned
    return summary, results


@torch.inference_mode()
def reload_check(model: torch.nn.Module, folder: Path, tokenizer) -> dict:  # type: ignore[no-untyped-def]
    """Logits and greedy text of the saved folder, loaded both ways, against the in-memory pruned model."""
    from transformers import AutoModelForCausalLM

    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    expected = model(input_ids=ids).logits
    text = model.generate(ids, max_new_tokens=8, do_sample=False)
    result = {}
    for way, loaded in (("gapprune.load", load(str(folder))[0]),
                        ("from_pretrained(trust_remote_code=True)",
                         AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval())):
        result[way] = {"identical_logits": bool(torch.equal(loaded(input_ids=ids).logits, expected)),
                       "identical_greedy_tokens": bool(torch.equal(loaded.generate(ids, max_new_tokens=8, do_sample=False), text))}
    return {"reload": result, "params": sum(p.numel() for p in model.parameters())}
