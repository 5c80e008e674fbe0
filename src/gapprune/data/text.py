"""Tokenised windows: the evaluation split cut into consecutive windows, and seeded calibration samples.

Some models were trained with a BOS token at the start of every sequence and break without it
(Gemma 3 270M: WikiText-2 perplexity ~440 without, ~48 with). For them (`bos_token_id` is not None)
every window is BOS followed by T - 1 text tokens, so windows keep their length T and every text
token is still predicted exactly once; models trained without BOS (SmolLM2, Qwen2) get none.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase


def tokenize_text(text: str, tokenizer: PreTrainedTokenizerBase) -> torch.Tensor:
    """All token ids of `text`, tokenised once without special tokens. Shape (N,)."""
    if not text.strip():
        raise ValueError("the text is empty: nothing to tokenise")
    ids = tokenizer(text, add_special_tokens=False, return_attention_mask=False)["input_ids"]
    return torch.tensor(ids, dtype=torch.long)


def bos_token_id(tokenizer: PreTrainedTokenizerBase) -> int | None:
    """The BOS id when the tokenizer puts BOS before encoded text (the model expects it), else None.

    Asked by encoding a probe rather than read from `add_bos_token`: fast tokenizers add BOS in a
    post-processor that attribute may not reflect (Gemma's GGUF tokenizer says False and adds it).
    """
    bos = tokenizer.bos_token_id
    if bos is None:
        return None
    ids = tokenizer("a", add_special_tokens=True, return_attention_mask=False)["input_ids"]
    return int(bos) if ids[:1] == [bos] else None


def _with_bos(windows: torch.Tensor, bos_id: int | None) -> torch.Tensor:
    """Prefix each text window (n, T - 1) with BOS -> (n, T); unchanged when bos_id is None."""
    if bos_id is None:
        return windows
    return torch.cat([windows.new_full((windows.shape[0], 1), bos_id), windows], dim=1)


def consecutive_windows(
    ids: torch.Tensor, seq_len: int, max_windows: int | None = None, bos_id: int | None = None
) -> torch.Tensor:
    """Non-overlapping windows of `seq_len` tokens (the tail shorter than a window is dropped). (n, T)

    With `bos_id`, each window is BOS + the next seq_len - 1 text tokens.
    """
    if seq_len < 2:
        raise ValueError(f"seq_len must be at least 2, got {seq_len}")
    text_len = seq_len - (bos_id is not None)
    n = ids.numel() // text_len
    if n == 0:
        raise ValueError(f"the text has {ids.numel()} tokens, fewer than one window of {seq_len}")
    if max_windows is not None:
        n = min(n, max_windows)
    return _with_bos(ids[: n * text_len].view(n, text_len), bos_id)


def sample_windows(
    ids: torch.Tensor, n_samples: int, seq_len: int, seed: int, bos_id: int | None = None
) -> torch.Tensor:
    """`n_samples` windows of `seq_len` tokens at seeded random starts (BOS first with `bos_id`). (n, T)"""
    text_len = seq_len - (bos_id is not None)
    starts = _sample_starts(ids.numel(), n_samples, text_len, seed)
    return _with_bos(torch.stack([ids[s : s + text_len] for s in starts]), bos_id)


def _sample_starts(n_tokens: int, n_samples: int, text_len: int, seed: int) -> list[int]:
    if n_tokens <= text_len:
        raise ValueError(f"the text has {n_tokens} tokens; a calibration window needs more than {text_len} tokens")
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, n_tokens - text_len, (n_samples,), generator=generator).tolist()


HELD_OUT_SEED = 7919  # added to the calibration seed: the held-out draw is its own stream


def held_out_windows(
    sources: list[torch.Tensor], n_calibration: int, n_samples: int, seq_len: int, seed: int,
    bos_id: int | None = None,
) -> torch.Tensor:
    """`n_samples` windows of the calibration sources that share no token position with the
    `n_calibration` windows `mixed_windows` draws with the same seed: text the plan was not fitted on,
    from the distribution it was fitted to. Interleaved like `mixed_windows`. (n, T)"""
    text_len = seq_len - (bos_id is not None)
    parts = []
    for k, ids in enumerate(sources):
        taken = _sample_starts(ids.numel(), len(range(k, n_calibration, len(sources))), text_len, seed + k)
        wanted = len(range(k, n_samples, len(sources)))
        candidates = _sample_starts(ids.numel(), 20 * wanted + 20, text_len, seed + k + HELD_OUT_SEED)
        free = [s for s in candidates if all(abs(s - t) >= text_len for t in taken)]
        starts: list[int] = []
        for s in free:  # held-out windows do not overlap each other either
            if len(starts) < wanted and all(abs(s - t) >= text_len for t in starts):
                starts.append(s)
        if len(starts) < wanted:
            raise ValueError(f"calibration source {k} ({ids.numel()} tokens) is too short for {wanted} held-out "
                             f"windows beside {len(taken)} calibration windows: lower the check's sample count")
        parts.append(_with_bos(torch.stack([ids[s : s + text_len] for s in starts]), bos_id))
    out = torch.empty(n_samples, seq_len, dtype=parts[0].dtype)
    for k, part in enumerate(parts):
        out[k :: len(sources)] = part
    return out


def mixed_windows(
    sources: list[torch.Tensor], n_samples: int, seq_len: int, seed: int, bos_id: int | None = None
) -> torch.Tensor:
    """`n_samples` seeded windows drawn evenly from several token streams, interleaved. (n, T)

    Source k gives every len(sources)-th window, starting at the k-th, so every prefix of the result
    (the loss table is measured on one) holds the sources in equal parts, to within one window.
    """
    if not 1 <= len(sources) <= n_samples:
        raise ValueError(f"{len(sources)} calibration sources need between 1 and {n_samples} (the sample count) of them")
    parts = [sample_windows(ids, len(range(k, n_samples, len(sources))), seq_len, seed + k, bos_id)
             for k, ids in enumerate(sources)]
    out = torch.empty(n_samples, parts[0].shape[1], dtype=parts[0].dtype)
    for k, part in enumerate(parts):
        out[k :: len(sources)] = part
    return out
