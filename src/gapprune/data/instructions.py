"""Alpaca-format instruction data ({instruction, input, output}): records, their prompt, and their text.

The data folder holds the first 5,000 rows of yahma/alpaca-cleaned. The `alpaca` set splits them by row:
rows 4,500-4,999 are its evaluation split (instruction perplexity: `gapprune ppl --dataset alpaca`), rows
0-4,499 its train split (calibration, LoRA, distillation), so nothing tuned on `alpaca` is judged on it.
The hub copy is split at the same rows.
"""

from __future__ import annotations

import json
from pathlib import Path

from gapprune.data.folder import data_dir

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
SPLIT_ROWS = {"train": slice(0, 4500), "validation": slice(4500, 5000)}


def check_instruction_data(name_or_path: str) -> None:
    """Refuse instruction data that is neither `alpaca` (data folder, then hub) nor an existing file."""
    if name_or_path != "alpaca" and not Path(name_or_path).is_file():
        raise FileNotFoundError(f"instruction data {name_or_path} does not exist")


def load_alpaca_records(name_or_path: str, data_directory: str | Path | None = None,
                        split: str = "train") -> list[dict[str, str]]:
    """Records of a local .json/.jsonl file (all of them), or of the `alpaca` set's `split` (data folder, then
    hub)."""
    path = Path(name_or_path)
    if name_or_path == "alpaca":
        if split not in SPLIT_ROWS:
            raise ValueError(f"the alpaca set has splits {', '.join(SPLIT_ROWS)}, not {split!r}")
        root = data_dir(data_directory)
        looked = []
        if root is not None:
            if (root / LOCAL_ALPACA).is_file():
                path = root / LOCAL_ALPACA
            looked.append(str(root / LOCAL_ALPACA))
        if not path.is_file():
            try:
                import datasets

                return list(datasets.load_dataset(HUB_ALPACA, split="train"))[SPLIT_ROWS[split]]
            except Exception as err:  # noqa: BLE001 - offline or missing datasets
                looked.append(f"hub {HUB_ALPACA} ({type(err).__name__})")
                raise FileNotFoundError("Alpaca data not found; looked at: " + "; ".join(looked)) from None
    check_instruction_data(str(path))
    text = path.read_text(encoding="utf-8")
    records = [json.loads(line) for line in text.splitlines() if line.strip()] if path.suffix == ".jsonl" else json.loads(text)
    if not records or not all("instruction" in r and "output" in r for r in records):
        raise ValueError(f"{path} is not Alpaca format (records need 'instruction' and 'output')")
    return records[SPLIT_ROWS[split]] if name_or_path == "alpaca" else records


def format_example(record: dict[str, str]) -> tuple[str, str]:
    """(prompt, response) of one record."""
    template = PROMPT_WITH_INPUT if record.get("input") else PROMPT_NO_INPUT
    return template.format(instruction=record["instruction"], input=record.get("input", "")), record["output"]


def instruction_text(split: str, data_directory: str | Path | None = None) -> str:
    """The `alpaca` set's split as text: each record's prompt and response, records apart by a blank line."""
    return "\n\n".join("".join(format_example(r)) for r in load_alpaca_records("alpaca", data_directory, split))
