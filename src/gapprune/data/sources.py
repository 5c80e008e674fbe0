"""Resolve a data-set name to text: the data folder first, then the Hugging Face hub.

The data folder comes from `--data-dir` or `$GAPPRUNE_DATA`; its layout is

    wikitext-2-raw/{test,validation}.jsonl   rows {"text": ...}
    ptb/{test,validation}.jsonl              rows {"sentence": ...}
    c4/c4_train_00000_first1000.jsonl        C4 en train: the first 1,000 documents of shard 00000
    c4/c4_validation_2k.jsonl                C4 en validation: 2,000 documents
    code/python_stdlib_{train,validation}.txt  CPython 3.11 stdlib modules, plain text (80 / 88 modules)
    alpaca/alpaca_data_cleaned_first5k.json    instruction records; rows 0-4,499 train, 4,500-4,999 validation

Each set names the split a role reads: calibration, evaluation, and training (distillation). WikiText-2
and PTB have no training role: their text is what pruned models are judged on. C4 calibrates and
trains on `train` and is evaluated on `validation`, so no role reads text another role is judged on.
`code` (Python source) splits the same way; it has no hub copy, so it is read from the data folder only.
C4 documents are joined ("\n\n") and windows are cut from the joined text: only ~38 of the 1,000
local documents are longer than 2,048 tokens, so the SparseGPT/Wanda sampler (one random window of
one random document longer than the window) would reuse those few. That is the recorded deviation.

Any `.txt` or `.jsonl` path can be given instead of a name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from gapprune.data.folder import DATA_ENV, data_dir
from gapprune.data.instructions import HUB_ALPACA, LOCAL_ALPACA, instruction_text


@dataclass(frozen=True)
class NamedTextSet:
    """Where a named text corpus lives locally and on the hub, and how its rows join."""

    local: dict[str, str]  # split -> path relative to the data folder
    field: str  # the text field of .jsonl rows; a .txt file is read whole
    hub: tuple[str, str | None] | None  # (path, config name) for datasets.load_dataset; None: data folder only
    calibration_split: str  # what `--calib NAME` reads
    evaluation_split: str  # what `gapprune ppl --dataset NAME` reads
    training_split: str | None = None  # what distillation may train on; None: an evaluation set, refused
    hub_files: dict[str, str] | None = None  # split -> data_files on the hub (C4: one shard, not 300 GB)
    joiner: str = "\n\n"
    records: bool = False  # rows that need formatting (instruction data): read by `data/instructions.py`


TEXT_SETS: dict[str, NamedTextSet] = {
    "wikitext2": NamedTextSet(
        local={"test": "wikitext-2-raw/test.jsonl", "validation": "wikitext-2-raw/validation.jsonl"},
        field="text",
        hub=("wikitext", "wikitext-2-raw-v1"),
        calibration_split="validation",
        evaluation_split="test",
    ),
    "ptb": NamedTextSet(
        local={"test": "ptb/test.jsonl", "validation": "ptb/validation.jsonl"},
        field="sentence",
        hub=("ptb_text_only", "penn_treebank"),
        calibration_split="validation",
        evaluation_split="test",
    ),
    "c4": NamedTextSet(
        local={"train": "c4/c4_train_00000_first1000.jsonl", "validation": "c4/c4_validation_2k.jsonl"},
        field="text",
        hub=("allenai/c4", None),
        calibration_split="train",
        evaluation_split="validation",
        training_split="train",
        # the shards SparseGPT, Wanda and SliceGPT read: the hub's copy holds all their documents, the
        # local files the first 1,000 (train) and 2,000 (validation)
        hub_files={"train": "en/c4-train.00000-of-01024.json.gz",
                   "validation": "en/c4-validation.00000-of-00008.json.gz"},
    ),
    "code": NamedTextSet(
        local={"train": "code/python_stdlib_train.txt", "validation": "code/python_stdlib_validation.txt"},
        field="text",
        hub=None,  # our own cut of the CPython standard library: no hub data set holds it
        calibration_split="train",
        evaluation_split="validation",
        training_split="train",
    ),
    "alpaca": NamedTextSet(  # instruction records, formatted with the Alpaca prompt; split by row
        local={"train": LOCAL_ALPACA, "validation": LOCAL_ALPACA},
        field="instruction",
        hub=(HUB_ALPACA, None),
        calibration_split="train",
        evaluation_split="validation",
        training_split="train",
        records=True,
    ),
}


def split_for(name: str, role: str, requested: str | None = None) -> str | None:
    """The split a role reads from a named set: `requested` when given, else the set's own for that role.

    role: "calibration", "evaluation" or "training". None for a file (it has no splits) and for a
    set without a training split."""
    if name not in TEXT_SETS:
        return None
    return requested or getattr(TEXT_SETS[name], f"{role}_split")


def _read_jsonl_rows(path: Path, field: str | None) -> list[str]:
    rows: list[str] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number} is not valid JSON: {err}") from None
            if isinstance(record, str):
                rows.append(record)
                continue
            key = field if field in record else next((k for k, v in record.items() if isinstance(v, str)), None)
            if key is None:
                raise ValueError(f"{path}:{number} has no text field (looked for {field!r})")
            rows.append(record[key])
    return rows


def read_text_file(path: str | Path, field: str = "text", joiner: str = "\n\n") -> str:
    """Text of a `.txt` file, or the rows of a `.jsonl` file joined by `joiner`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"text file {path} does not exist")
    if path.suffix == ".jsonl":
        text = joiner.join(_read_jsonl_rows(path, field))
    elif path.suffix in (".txt", ".raw", ""):
        text = path.read_text(encoding="utf-8")
    else:
        raise ValueError(f"{path}: expected a .txt or .jsonl file")
    if not text.strip():
        raise ValueError(f"{path} holds no text")
    return text


def check_source(name_or_path: str, split: str | None = None) -> None:
    """Refuse a text source that cannot be read, before any model loads: an unknown name, a split the set
    lacks, a file that is missing or of another kind. A named set's text itself is found later (the data
    folder, else the hub), so only what is certain now is checked."""
    if name_or_path in TEXT_SETS:
        spec = TEXT_SETS[name_or_path]
        if (split or spec.evaluation_split) not in spec.local:
            raise ValueError(f"data set {name_or_path!r} has splits {', '.join(spec.local)}, not {split!r}")
        return
    if Path(name_or_path).suffix not in (".txt", ".jsonl", ".raw"):
        raise ValueError(
            f"unknown data set {name_or_path!r}: use one of {', '.join(TEXT_SETS)} or a .txt/.jsonl file path"
        )
    if not Path(name_or_path).is_file():
        raise FileNotFoundError(f"text file {name_or_path} does not exist")


def load_text(name_or_path: str, split: str | None = None, data_directory: str | Path | None = None) -> str:
    """The whole text of a named data set's split (default: its evaluation split), or of a text file.

    Raises FileNotFoundError naming every place looked at when nothing is found.
    """
    check_source(name_or_path, split)
    if name_or_path not in TEXT_SETS:
        return read_text_file(name_or_path)
    spec = TEXT_SETS[name_or_path]
    split = split or spec.evaluation_split
    if spec.records:
        return instruction_text(split, data_directory)
    looked: list[str] = []
    folder = data_dir(data_directory)
    if folder is not None:
        local = folder / spec.local[split]
        if local.is_file():
            return read_text_file(local, spec.field, spec.joiner)
        looked.append(str(local) if folder.is_dir() else f"{local} (the data folder {folder} does not exist)")
    else:
        looked.append(f"no data folder (set data_dir or ${DATA_ENV})")
    if spec.hub is None:
        raise FileNotFoundError(
            f"data set {name_or_path!r} split {split!r} is read from the data folder only (it has no hub copy): "
            f"set --data-dir (data_dir) or ${DATA_ENV} to the folder holding {spec.local[split]}; looked at: "
            + "; ".join(looked)
        )
    try:
        return _load_from_hub(spec, split)
    except Exception as err:  # noqa: BLE001 - offline, datasets missing, hub error: report all places
        looked.append(f"Hugging Face hub {spec.hub[0]}/{spec.hub[1] or ''} ({type(err).__name__}: {err})")
    raise FileNotFoundError(
        f"data set {name_or_path!r} split {split!r} not found; looked at: " + "; ".join(looked)
    )


def _load_from_hub(spec: NamedTextSet, split: str) -> str:
    import datasets  # optional: only needed when reading from the hub

    assert spec.hub is not None  # load_text never asks the hub for a local-only set
    if spec.hub_files is not None:
        rows = datasets.load_dataset(spec.hub[0], data_files={split: spec.hub_files[split]}, split=split)[spec.field]
    else:
        rows = datasets.load_dataset(spec.hub[0], spec.hub[1], split=split)[spec.field]
    return spec.joiner.join(rows)
