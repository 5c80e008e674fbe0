"""Alpaca-format instruction records -> token ids with the Alpaca prompt, for LoRA (the data: `data/instructions.py`)."""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from gapprune.data.instructions import format_example


def tokenize_examples(
    records: list[dict[str, str]], tokenizer: PreTrainedTokenizerBase, cutoff: int, train_on_inputs: bool = True
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(input_ids, labels) per record, truncated to `cutoff` tokens, eos appended; labels -100 on the
    prompt when `train_on_inputs` is False."""
    out = []
    for record in records:
        prompt, response = format_example(record)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        full = (prompt_ids + tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])[:cutoff]
        labels = list(full)
        if not train_on_inputs:
            labels[: min(len(prompt_ids), len(labels))] = [-100] * min(len(prompt_ids), len(labels))
        out.append((torch.tensor(full), torch.tensor(labels)))
    return out


def collate(batch: list[tuple[torch.Tensor, torch.Tensor]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a batch; padded positions are masked out of attention and loss."""
    length = max(ids.numel() for ids, _ in batch)
    input_ids = torch.full((len(batch), length), pad_id)
    labels = torch.full((len(batch), length), -100)
    mask = torch.zeros((len(batch), length), dtype=torch.long)
    for i, (ids, lab) in enumerate(batch):
        input_ids[i, : ids.numel()] = ids
        labels[i, : lab.numel()] = lab
        mask[i, : ids.numel()] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": mask}
