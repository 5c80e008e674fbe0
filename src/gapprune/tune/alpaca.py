"""Alpaca-format instruction data: records {instruction, input, output} -> token ids with the Alpaca prompt."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from gapprune.data.sources import data_dir

PROMPT_WITH_INPUT = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
PROMPT_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)
LOCAL_ALPACA = "alpaca/alpaca_data_cleaned_first5k.json"
HUB_ALPACA = "yahma/alpaca-cleaned"


def check_instruction_data(name_or_path: str) -> None:
    """Refuse instruction data that is neither `alpaca` (data folder, then hub) nor an existing file."""
    if name_or_path != "alpaca" and not Path(name_or_path).is_file():
        raise FileNotFoundError(f"instruction data {name_or_path} does not exist")


def load_alpaca_records(name_or_path: str, data_directory: str | Path | None = None) -> list[dict[str, str]]:
    """Records from a local .json/.jsonl file, the data folder (`alpaca`), or the hub."""
    path = Path(name_or_path)
    if name_or_path == "alpaca":
        root = data_dir(data_directory)
        looked = []
        if root is not None:
            if (root / LOCAL_ALPACA).is_file():
                path = root / LOCAL_ALPACA
            looked.append(str(root / LOCAL_ALPACA))
        if not path.is_file():
            try:
                import datasets

                return list(datasets.load_dataset(HUB_ALPACA, split="train"))
            except Exception as err:  # noqa: BLE001 - offline or missing datasets
                looked.append(f"hub {HUB_ALPACA} ({type(err).__name__})")
                raise FileNotFoundError("Alpaca data not found; looked at: " + "; ".join(looked)) from None
    check_instruction_data(str(path))
    text = path.read_text(encoding="utf-8")
    records = [json.loads(line) for line in text.splitlines() if line.strip()] if path.suffix == ".jsonl" else json.loads(text)
    if not records or not all("instruction" in r and "output" in r for r in records):
        raise ValueError(f"{path} is not Alpaca format (records need 'instruction' and 'output')")
    return records


def format_example(record: dict[str, str]) -> tuple[str, str]:
    """(prompt, response) of one record."""
    template = PROMPT_WITH_INPUT if record.get("input") else PROMPT_NO_INPUT
    return template.format(instruction=record["instruction"], input=record.get("input", "")), record["output"]


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
