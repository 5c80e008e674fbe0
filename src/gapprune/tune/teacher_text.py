"""Training text for distillation, with no evaluation-domain data in it.

Sources, joined with `+` (e.g. `self+alpaca`):

* `self`: text the teacher writes itself (the `--calib self` sampler, long sequences cut into
  windows). Generation is the slow part, so it is done once and cached on disk, one file per
  batch, so that a killed run resumes where generation stopped and later runs reuse it.
* `alpaca`: instruction data (prompt and response, EOS between records), packed into windows.
* `c4`: web text, the train split of C4 `en` (documents joined, packed into windows).
* `code`: Python source, the train split of our CPython standard-library text (packed into windows).
* a `.txt` file, or a `.json`/`.jsonl` file of Alpaca records.

Named sets without a training split (`wikitext2`, `ptb`: evaluation text) are refused by name:
distillation must not see them.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gapprune.data import (
    TEXT_SETS,
    bos_token_id,
    load_text,
    read_text_file,
    self_generated_windows,
    split_for,
    tokenize_text,
)
from gapprune.data.instructions import format_example, load_alpaca_records

log = logging.getLogger(__name__)


def pack_windows(ids: torch.Tensor, seq_len: int, bos_id: int | None) -> torch.Tensor:
    """Cut a token stream (N,) into windows (n, seq_len), BOS first when the model expects it."""
    text_len = seq_len - (bos_id is not None)
    n = ids.numel() // text_len
    if n == 0:
        raise ValueError(f"{ids.numel()} tokens of training text are fewer than one window of {seq_len}")
    windows = ids[: n * text_len].view(n, text_len)
    if bos_id is not None:
        windows = torch.cat([windows.new_full((n, 1), bos_id), windows], dim=1)
    return windows


def alpaca_stream(records: list[dict[str, str]], tokenizer: PreTrainedTokenizerBase) -> torch.Tensor:
    """All records as one token stream (N,): prompt + response + EOS, record after record."""
    eos = tokenizer.eos_token_id
    pieces: list[int] = []
    for record in records:
        prompt, response = format_example(record)
        pieces += tokenizer(prompt + response, add_special_tokens=False)["input_ids"]
        if eos is not None:
            pieces.append(int(eos))
    return torch.tensor(pieces, dtype=torch.long)


def teacher_windows(
    teacher: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, n_windows: int, seq_len: int, gen_len: int,
    seed: int, cache_dir: Path, teacher_id: str, batch_size: int = 64, temperature: float = 1.0, top_p: float = 0.95,
) -> torch.Tensor:
    """`n_windows` windows (n, seq_len) cut from sequences of `gen_len` tokens the teacher writes.

    Sampling is a token at a time, so small batches pay mostly per-step overhead: SmolLM2 on two
    CPU threads writes 100 tokens/s in batches of 16, 157 in batches of 64, 191 in batches of 128
    (2026-12-01); 64 keeps the KV cache near 1.5 GB for 512-token sequences.

    Each batch of sequences is sampled with its own seed and cached as one file under `cache_dir`,
    keyed by the teacher and the settings, so generation resumes after a kill and is reused.
    """
    bos = bos_token_id(tokenizer)
    text_len = seq_len - (bos is not None)
    per_sequence = max(1, gen_len // text_len)
    n_sequences = -(-n_windows // per_sequence)
    fingerprint = round(float(teacher.get_output_embeddings().weight.detach()[:16].double().sum()), 6)  # same name, other weights
    key = json.dumps([teacher_id, fingerprint, text_len * per_sequence, seed, temperature, top_p, batch_size])
    folder = cache_dir / hashlib.sha256(key.encode()).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "settings.json").write_text(key + "\n")
    parts = []
    n_batches = -(-n_sequences // batch_size)
    for i in tqdm(range(n_batches), desc="teacher text", unit="batch"):
        path = folder / f"part_{i:05d}.pt"
        if path.is_file():
            part = torch.load(path, weights_only=True)
        else:
            part = self_generated_windows(
                teacher, tokenizer, batch_size, text_len * per_sequence + (bos is not None), seed=seed + i,
                temperature=temperature, top_p=top_p, lead=0, batch_size=batch_size, progress=False,
            )  # (b, [BOS] + per_sequence * text_len)
            tmp = path.with_suffix(".tmp")
            torch.save(part, tmp)
            tmp.replace(path)  # a kill never leaves half a file
        parts.append(part[:, (bos is not None):])
    text = torch.cat(parts)[:n_sequences]  # (n_sequences, per_sequence * text_len)
    windows = text.reshape(-1, text_len)[:n_windows]
    if bos is not None:
        windows = torch.cat([windows.new_full((windows.shape[0], 1), bos), windows], dim=1)
    log.info("teacher text: %d windows of %d tokens (cache %s)", windows.shape[0], seq_len, folder)
    return windows


def check_training_sources(spec: str) -> list[str]:
    """The sources `spec` names, each one that cannot be trained on refused: an evaluation set, or a name
    that is neither self, alpaca, a named set nor an existing file. Cheap: the CLI calls it before loading."""
    sources = spec.split("+")
    for source in sources:
        if source in TEXT_SETS and split_for(source, "training") is None:
            raise ValueError(f"{source!r} is an evaluation set; distillation trains on text with no evaluation "
                             "data in it (self, alpaca, c4, code, or a file of other text)")
        if source not in TEXT_SETS and source not in ("self", "alpaca") and not Path(source).is_file():
            raise FileNotFoundError(f"training text {source!r} is neither self, alpaca, c4, code nor an existing file")
    return sources


def training_windows(
    spec: str, tokenizer: PreTrainedTokenizerBase, seq_len: int, *, teacher: PreTrainedModel | None = None,
    teacher_id: str = "", self_windows: int = 512, self_len: int = 512, cache_dir: Path | None = None,
    data_dir: str | None = None, seed: int = 0,
) -> tuple[torch.Tensor, dict[str, int]]:
    """Windows (n, seq_len) of every source in `spec` (joined by '+'), and the window count per source."""
    bos = bos_token_id(tokenizer)
    sources = check_training_sources(spec)  # all checked before any text is generated
    out, counts = [], {}
    for source in sources:
        if source == "self":
            if teacher is None or cache_dir is None:
                raise ValueError("teacher-written text needs the teacher and a cache folder")
            windows = teacher_windows(teacher, tokenizer, n_windows=self_windows, seq_len=seq_len, gen_len=self_len,
                                      seed=seed, cache_dir=cache_dir, teacher_id=teacher_id)
        elif source == "alpaca" or source.endswith((".json", ".jsonl")) and not _is_text_jsonl(source):
            # records with EOS between them (the alpaca set's train rows, or all of a file's)
            windows = pack_windows(alpaca_stream(load_alpaca_records(source, data_dir), tokenizer), seq_len, bos)
        elif source in TEXT_SETS:
            text = load_text(source, split_for(source, "training"), data_dir)
            windows = pack_windows(tokenize_text(text, tokenizer), seq_len, bos)
        else:  # an existing text file (check_training_sources)
            windows = pack_windows(tokenize_text(read_text_file(source), tokenizer), seq_len, bos)
        out.append(windows)
        counts[source] = int(windows.shape[0])
    return torch.cat(out), counts


def _is_text_jsonl(path: str) -> bool:
    """A .jsonl of {"text": ...} rows (plain text), rather than Alpaca records."""
    if not path.endswith(".jsonl") or not Path(path).is_file():
        return False
    with open(path, encoding="utf-8") as f:
        first = next((line for line in f if line.strip()), "{}")
    return "text" in json.loads(first) and "instruction" not in json.loads(first)
