"""Calibration text sampled from the model itself, so pruning needs no data set at all.

Two choices bring the sampled text closer to what the model was trained on. Measured on SmolLM2
at 25% (docs/results.md), self-calibration still costs perplexity: WikiText-2 / PTB 179.7 / 219.0
against 93.8 / 161.1 with WikiText-2 calibration (the earlier random-token sampler: 205.8 / 287.2,
measured with other profiler and criterion settings).

* the start: every sequence begins after the document separator the model was trained with (BOS
  where the tokenizer adds one, else `<|endoftext|>`, else EOS), so its first token is sampled from
  the model's own distribution of document beginnings, not drawn uniformly from the vocabulary
  (LLM-QAT's random token puts the sequence in a context the model never saw);
* the window: `lead` tokens more than the window are generated and the window is the *end* of the
  sequence, so calibration sees text in the middle of a document, like the evaluation windows, and
  not only openings.
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm
from transformers import GenerationMixin, PreTrainedModel, PreTrainedTokenizerBase

from gapprune.data.text import bos_token_id

DOCUMENT_SEPARATORS = ("<|endoftext|>", "</s>", "<|end_of_text|>")


def document_start_id(tokenizer: PreTrainedTokenizerBase) -> int | None:
    """The token a document follows in training: BOS when the tokenizer adds it, else a known
    end-of-text token, else EOS; None when the tokenizer has none of them."""
    bos = bos_token_id(tokenizer)
    if bos is not None:
        return bos
    vocab = tokenizer.get_vocab()
    for token in DOCUMENT_SEPARATORS:
        if token in vocab:
            return int(vocab[token])
    return None if tokenizer.eos_token_id is None else int(tokenizer.eos_token_id)


@torch.inference_mode()
def self_generated_windows(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    n_samples: int,
    seq_len: int,
    seed: int,
    temperature: float = 1.0,
    top_p: float = 0.95,
    lead: int | None = None,
    batch_size: int = 8,
    progress: bool = True,
) -> torch.Tensor:
    """`n_samples` windows of exactly `seq_len` tokens sampled from the model. (n, T)

    Each sequence is sampled (seeded) after the document separator, `lead` (default T/2) tokens
    longer than the window, and cut to its last tokens; models that need BOS get BOS + T − 1.
    """
    if not isinstance(model, GenerationMixin):
        raise TypeError(f"{type(model).__name__} cannot generate text; calibrate on a data set instead of 'self'")
    lead = seq_len // 2 if lead is None else lead
    bos = bos_token_id(tokenizer)
    start = document_start_id(tokenizer)
    text_len = seq_len - (bos is not None)
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    out: list[torch.Tensor] = []
    bar = tqdm(total=n_samples, desc="sampling calibration text", unit="window", disable=not progress)
    for first in range(0, n_samples, batch_size):
        b = min(batch_size, n_samples - first)
        if start is None:  # no separator: a random vocabulary token (LLM-QAT)
            context = torch.randint(0, int(model.config.vocab_size), (b, 1), generator=generator)
        else:
            context = torch.full((b, 1), start)
        context = context.to(device)
        new = text_len + lead
        seqs = model.generate(
            context, attention_mask=torch.ones_like(context), do_sample=True, temperature=temperature, top_p=top_p,
            max_new_tokens=new, min_new_tokens=new, pad_token_id=tokenizer.pad_token_id,
        )
        text = seqs[:, -text_len:].cpu()
        out.append(text if bos is None else torch.cat([text.new_full((b, 1), bos), text], dim=1))
        bar.update(b)
    bar.close()
    return torch.cat(out)
