"""Calibration text sampled from the model itself, so pruning needs no data set at all."""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from gapprune.data.text import bos_token_id


@torch.inference_mode()
def self_generated_windows(
    model: nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    n_samples: int,
    seq_len: int,
    seed: int,
    temperature: float = 1.0,
    top_p: float = 0.95,
    batch_size: int = 8,
) -> torch.Tensor:
    """`n_samples` sequences of exactly `seq_len` tokens sampled from the model. (n, T)

    Each starts from one random vocabulary token (seeded), as in LLM-QAT's data-free calibration,
    so the samples cover different topics; after BOS for models that need it.
    """
    bos = bos_token_id(tokenizer)
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    vocab = int(model.config.vocab_size)
    out: list[torch.Tensor] = []
    for start in range(0, n_samples, batch_size):
        b = min(batch_size, n_samples - start)
        first = torch.randint(0, vocab, (b, 1), generator=generator).to(device)
        if bos is not None:
            first = torch.cat([first.new_full((b, 1), bos), first], dim=1)  # (b, 2)
        seqs = model.generate(
            first,
            attention_mask=torch.ones_like(first),
            do_sample=True,
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=seq_len - first.shape[1],
            min_new_tokens=seq_len - first.shape[1],
            pad_token_id=tokenizer.pad_token_id,
        )
        out.append(seqs[:, :seq_len].cpu())
    return torch.cat(out)
