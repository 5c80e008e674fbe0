"""Tokenised windows: the evaluation split cut into consecutive windows, and seeded calibration samples."""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase


def tokenize_text(text: str, tokenizer: PreTrainedTokenizerBase) -> torch.Tensor:
    """All token ids of `text`, tokenised once without special tokens. Shape (N,)."""
    if not text.strip():
        raise ValueError("the text is empty: nothing to tokenise")
    ids = tokenizer(text, add_special_tokens=False, return_attention_mask=False)["input_ids"]
    return torch.tensor(ids, dtype=torch.long)


def consecutive_windows(ids: torch.Tensor, seq_len: int, max_windows: int | None = None) -> torch.Tensor:
    """Non-overlapping windows of `seq_len` tokens (the tail shorter than a window is dropped). (n, T)"""
    if seq_len < 2:
        raise ValueError(f"seq_len must be at least 2, got {seq_len}")
    n = ids.numel() // seq_len
    if n == 0:
        raise ValueError(f"the text has {ids.numel()} tokens, fewer than one window of {seq_len}")
    if max_windows is not None:
        n = min(n, max_windows)
    return ids[: n * seq_len].view(n, seq_len)


def sample_windows(ids: torch.Tensor, n_samples: int, seq_len: int, seed: int) -> torch.Tensor:
    """`n_samples` windows of `seq_len` tokens at seeded random starts. (n, T)"""
    if ids.numel() <= seq_len:
        raise ValueError(f"the text has {ids.numel()} tokens; a calibration window needs more than {seq_len}")
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, ids.numel() - seq_len, (n_samples,), generator=generator)
    return torch.stack([ids[s : s + seq_len] for s in starts.tolist()])
