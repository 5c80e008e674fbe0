"""Perplexity by the usual protocol: the whole split tokenised once, non-overlapping windows.

Each window is scored independently (no context carried over), every token but the first of a
window is predicted, and the mean negative log-likelihood over all predicted tokens is exponentiated.
Windows of models that need BOS start with it (`gapprune.data.text`), and `bos` records that protocol:
numbers with and without BOS are not comparable.
The LM head runs on a few hundred positions at a time, so memory stays bounded for any batch, window
length and vocabulary. With `resume`, every scored window's NLL is kept on disk as it is measured, so
a whole-test-set run of a large model on CPUs (hours) that is stopped goes on where it stopped.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from gapprune.data import bos_token_id, consecutive_windows, load_text, split_for, tokenize_text
from gapprune.evaluate.fingerprint import settings_fingerprint, tensor_fingerprint, weights_fingerprint

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PerplexityResult:
    dataset: str
    split: str
    seq_len: int
    windows: int
    tokens: int  # tokens of the whole split
    predicted_tokens: int
    nll: float
    ppl: float
    wall_s: float
    bos: bool = False  # every window starts with BOS (then T - 1 text tokens, all predicted)
    windows_resumed: int = 0  # windows read from a stopped run's log (`wall_s` is this run's part only)

    def to_record(self) -> dict[str, object]:
        return asdict(self)


def token_nll(model: PreTrainedModel, input_ids: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """Summed next-token NLL of each sequence. input_ids (B, T) -> (B,) float64.

    The head runs on `chunk` positions at a time across the whole batch: float32 logits of a batch of
    16 windows of 128 tokens over a 151,936-token vocabulary would be 1.2 GB at once, more than the
    weights of a small model, and would set the evaluation's peak memory.
    """
    hidden = model.get_decoder()(input_ids=input_ids).last_hidden_state[:, :-1]  # (B, T-1, hidden)
    head = model.get_output_embeddings()
    batch, positions = hidden.shape[:2]
    flat_hidden = hidden.reshape(batch * positions, -1)
    targets = input_ids[:, 1:].reshape(-1)
    nll = torch.empty(batch * positions, dtype=torch.float32, device=input_ids.device)
    for start in range(0, batch * positions, chunk):
        stop = min(start + chunk, batch * positions)
        logits = head(flat_hidden[start:stop]).float()  # (c, V)
        nll[start:stop] = F.cross_entropy(logits, targets[start:stop], reduction="none")
    return nll.view(batch, positions).double().sum(dim=1)


class WindowLog:
    """The NLL of every window scored so far, kept in `folder` under a key of everything that decides
    them: the weights, the model's config, the device type, torch's version, the windows and the batch
    size (batches of other shapes can round differently). Rewritten whole after each batch; a log that
    does not fit the windows is set aside with a warning and the run starts again."""

    def __init__(self, folder: str | Path | None, model: PreTrainedModel, windows: torch.Tensor, batch_size: int):
        self.batch_size, self.n = batch_size, windows.shape[0]
        self.nll: list[float] = []
        self.path = None
        if folder is None:
            return
        self.path = Path(folder) / (f"ppl-{weights_fingerprint(model)}-{tensor_fingerprint(windows)}-{settings_fingerprint(model)}"
                                    f"-b{batch_size}.json")
        if self.path.is_file():
            self.nll = self._read(self.path)

    def _read(self, path: Path) -> list[float]:
        try:
            nll = json.loads(path.read_text())["nll"]
            if not (isinstance(nll, list) and all(isinstance(v, float) for v in nll)):
                raise ValueError("not a list of numbers")
            if len(nll) > self.n or (len(nll) % self.batch_size and len(nll) != self.n):
                raise ValueError(f"{len(nll)} windows for {self.n} in batches of {self.batch_size}")
        except (ValueError, KeyError, TypeError) as err:  # JSONDecodeError is a ValueError
            log.warning("perplexity log %s does not fit these windows (%s): scoring them all again", path, err)
            return []
        return nll

    def extend(self, nll: list[float]) -> None:
        self.nll += nll
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial = self.path.with_suffix(f".{os.getpid()}.partial")  # two processes never write one file
            partial.write_text(json.dumps({"nll": self.nll}))
            os.replace(partial, self.path)  # a kill mid-write leaves the previous log whole


@torch.inference_mode()
def perplexity(
    model: PreTrainedModel,
    windows: torch.Tensor,
    *,
    batch_size: int = 8,
    dataset: str = "",
    split: str = "",
    text_tokens: int | None = None,
    progress: bool = True,
    bos: bool = False,
    resume: str | Path | None = None,
) -> PerplexityResult:
    """Perplexity of `model` over `windows` (n, T); `bos`: the windows start with BOS (recorded);
    `resume`: a folder where the windows' NLLs are kept, so a stopped run goes on where it stopped."""
    device = next(model.parameters()).device
    n, seq_len = windows.shape
    start = time.perf_counter()
    kept = WindowLog(resume, model, windows, batch_size)
    resumed = len(kept.nll)
    bar = tqdm(total=n, initial=resumed, desc=f"ppl {dataset or ''} T={seq_len}", unit="win",
               disable=not progress)
    for i in range(resumed, n, batch_size):
        batch = windows[i : i + batch_size].to(device)
        kept.extend(token_nll(model, batch).tolist())
        bar.update(batch.shape[0])
    bar.close()
    predicted = n * (seq_len - 1)
    nll = math.fsum(kept.nll) / predicted  # exact sum: a resumed run gives the fresh run's number
    return PerplexityResult(
        dataset=dataset,
        split=split,
        seq_len=seq_len,
        windows=n,
        tokens=text_tokens if text_tokens is not None else windows.numel(),
        predicted_tokens=predicted,
        nll=nll,
        ppl=math.exp(nll),
        wall_s=round(time.perf_counter() - start, 2),
        bos=bos,
        windows_resumed=resumed,
    )


def evaluate_ppl(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    dataset: str,
    *,
    split: str | None = None,
    seq_len: int = 2048,
    max_windows: int | None = None,
    batch_size: int | None = None,
    data_dir: str | None = None,
    progress: bool = True,
    resume: str | Path | None = None,
) -> PerplexityResult:
    """Perplexity on a named data set or text file (whole split tokenised once; BOS per window when
    the tokenizer adds one, recorded in the result). `split` None: the set's evaluation split (test
    for wikitext2 and ptb, validation for c4); `resume`: see `perplexity`."""
    split = split_for(dataset, "evaluation", split) or split or "test"
    ids = tokenize_text(load_text(dataset, split, data_dir), tokenizer)
    bos = bos_token_id(tokenizer)
    windows = consecutive_windows(ids, seq_len, max_windows, bos_id=bos)
    batch = batch_size or max(1, 2048 // seq_len)
    return perplexity(
        model, windows, batch_size=batch, dataset=dataset, split=split, text_tokens=ids.numel(), progress=progress,
        bos=bos is not None, resume=resume,
    )
