"""High-level entry points shared by the Python API and the CLI."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from gapprune.config import PruneConfig
from gapprune.data import consecutive_windows, load_text, tokenize_text
from gapprune.evaluate.perplexity import PerplexityResult, perplexity
from gapprune.export.save import save
from gapprune.models.loading import load_model
from gapprune.pipeline import Profile, allocate, plan_from_allocation, profile_model, prune_model_
from gapprune.prune.plan import Plan

log = logging.getLogger(__name__)


def load(spec: str, device: str = "cpu", dtype: torch.dtype = torch.float32) -> tuple[nn.Module, PreTrainedTokenizerBase]:
    """Load a dense or gapprune-pruned model (no remote code needed) and its tokenizer."""
    return load_model(spec, device=device, dtype=dtype)


def evaluate_ppl(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    dataset: str,
    *,
    split: str = "test",
    seq_len: int = 2048,
    max_windows: int | None = None,
    batch_size: int | None = None,
    data_dir: str | None = None,
    progress: bool = True,
) -> PerplexityResult:
    """Perplexity on a named data set or text file (whole split tokenised once)."""
    ids = tokenize_text(load_text(dataset, split, data_dir), tokenizer)
    windows = consecutive_windows(ids, seq_len, max_windows)
    batch = batch_size or max(1, 2048 // seq_len)
    return perplexity(
        model, windows, batch_size=batch, dataset=dataset, split=split, text_tokens=ids.numel(), progress=progress
    )


def prune(
    model: nn.Module, tokenizer: PreTrainedTokenizerBase, config: PruneConfig, profile: Profile | None = None
) -> tuple[Plan, Profile]:
    """Prune `model` in place by `config`; returns the plan and the (reusable) dense profile."""
    profile = profile or profile_model(model, tokenizer, config)
    start = time.perf_counter()
    allocation = allocate(profile, config.ratio, config.allocator, config.refine, config.mlp_stride)
    profile.timings["allocation"] = round(time.perf_counter() - start, 3)
    plan = plan_from_allocation(profile, allocation, config.to_dict())
    start = time.perf_counter()
    biases_before = _out_proj_bias_params(profile)
    plan.summary["compensation"] = prune_model_(model, plan, config.compensate, profile.gram, config.ridge)
    profile.timings["surgery_and_compensation"] = round(time.perf_counter() - start, 3)
    added = _out_proj_bias_params(profile) - biases_before  # bias compensation adds (hidden,) per component
    plan.summary["params_after_with_added_biases"] = plan.summary["params_after"] + added
    after = sum(p.numel() for p in model.parameters()) - added
    if after != plan.summary["params_after"]:
        raise RuntimeError(f"surgery left {after:,} parameters, the plan expected {plan.summary['params_after']:,}")
    return plan, profile


def _out_proj_bias_params(profile: Profile) -> int:
    adapter = profile.adapter
    outs = (adapter.out_proj(layer, c) for layer in range(adapter.n_layers) for c in ("attn", "mlp"))
    return sum(out.bias.numel() for out in outs if out is not None and out.bias is not None)


def write_pruned_folder(
    out: str | Path,
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    plan: Plan,
    profile: Profile,
    evaluation: list[dict[str, Any]] | None = None,
    plots: bool = True,
    overwrite: bool = False,
) -> Path:
    """The pruned model folder plus plan.json, loss_table.json, report.md, eval.json and plots."""
    from gapprune.evaluate.report import write_report

    def extras(folder: Path) -> None:
        plan.save(folder / "plan.json")
        profile.table.save(folder / "loss_table.json")
        if evaluation:
            (folder / "eval.json").write_text(json.dumps(evaluation, indent=1) + "\n")
        if plots:
            try:
                from gapprune.evaluate.plots import plot_kept_fraction, plot_loss_table

                plot_kept_fraction(plan, folder / "kept_fraction.png", f"{plan.summary['allocator']} at {plan.config['ratio']}")
                plot_loss_table(profile.table, folder / "loss_table.png")
            except ImportError as err:
                log.warning("%s; skipping plots", err)
        write_report(folder / "report.md", plan, profile.timings, evaluation)

    return save(model, tokenizer, out, extras=extras, overwrite=overwrite)
