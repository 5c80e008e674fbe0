"""Run exported GGUF files in llama.cpp from Python (through cyllama): logits, perplexity, speed.

cyllama ships llama.cpp compiled into a wheel, so nothing is built here. Its context asks the model
object for an `n_vocab` attribute that its model class lacks; `_Model` adds it. For comparisons
with transformers the KV cache is kept in float32 and flash attention off (llama.cpp's defaults,
an f16 cache and automatic flash attention, round K and V to f16); speed runs use the defaults.

Logits and perplexity default to one thread: results do not depend on it, and on a busy machine
ggml's spinning thread barriers make two threads many times slower than one (measured here: 25 s
instead of 3 s for a 128-token window of SmolLM2 at a load average of 10 on two cores).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gapprune.evaluate.perplexity import PerplexityResult
from gapprune.llamacpp_binding import import_cyllama

GGML_TYPE_F32 = 0
FLASH_ATTN_DISABLED = 0


class GgufRunner:
    """One GGUF model and one context (a single sequence), for logits and timing."""

    def __init__(self, path: str | Path, *, n_ctx: int = 2048, n_batch: int = 512, threads: int = 1,
                 exact: bool = True) -> None:
        cy = import_cyllama()
        cy.disable_logging()
        cy.llama_backend_init()

        class _Model(cy.LlamaModel):  # type: ignore[misc,name-defined]
            @property
            def n_vocab(self) -> int:
                return int(self.get_vocab().n_vocab)

        if not Path(path).is_file():
            raise FileNotFoundError(f"GGUF file {path} does not exist")
        self._cy = cy
        self.model = _Model(str(path), cy.LlamaModelParams())
        params = cy.LlamaContextParams()
        params.n_ctx, params.n_batch, params.n_ubatch = n_ctx, n_batch, n_batch
        params.n_threads = params.n_threads_batch = threads
        if exact:
            params.type_k = params.type_v = GGML_TYPE_F32
            params.flash_attn_type = FLASH_ATTN_DISABLED
        self.ctx = cy.LlamaContext(self.model, params)
        self.vocab = self.model.get_vocab()
        self.n_vocab = int(self.vocab.n_vocab)
        self.n_batch = n_batch
        self._batch = cy.LlamaBatch(n_tokens=n_batch, embd=0, n_seq_max=1)

    def tokenize(self, text: str, add_special: bool = False) -> list[int]:
        return list(self.vocab.tokenize(text, add_special=add_special, parse_special=True))

    def clear(self) -> None:
        """Forget the sequence (empty the KV cache)."""
        self.ctx.kv_cache_clear()

    def decode(self, ids: Sequence[int], start: int = 0, all_logits: bool = True) -> np.ndarray | None:
        """Feed `ids` at positions start.. (appending to the cache). Returns logits (T, V) or, with
        all_logits=False, nothing is read back but the last position's logits are computed."""
        rows: list[Any] = []
        for chunk_start in range(0, len(ids), self.n_batch):
            chunk = ids[chunk_start : chunk_start + self.n_batch]
            last = chunk_start + len(chunk) == len(ids)
            self._batch.clear()
            for j, token in enumerate(chunk):
                self._batch.add(int(token), start + chunk_start + j, [0], all_logits or (last and j == len(chunk) - 1))
            self.ctx.decode(self._batch)
            if all_logits:
                rows.extend(self.ctx.get_logits_ith(j) for j in range(len(chunk)))
        return np.asarray(rows, dtype=np.float32) if all_logits else None

    def last_logits(self) -> np.ndarray:
        return np.asarray(self.ctx.get_logits_ith(-1), dtype=np.float32)

    def close(self) -> None:
        self.ctx.close()
        self.model.close()


def _nll(logits: np.ndarray, targets: np.ndarray) -> float:
    """Summed next-token NLL in float64; logits (T-1, V), targets (T-1,). torch's logsumexp is
    several times faster than numpy's exp here, which matters at 128 x 49,152 values a window."""
    x = torch.from_numpy(logits).double()  # (T-1, V)
    picked = x.gather(1, torch.from_numpy(targets).long()[:, None])[:, 0]  # (T-1,)
    return float((torch.logsumexp(x, dim=1) - picked).sum())


def gguf_perplexity(path: str | Path, windows: torch.Tensor, *, threads: int = 1, dataset: str = "",
                    split: str = "", text_tokens: int | None = None) -> PerplexityResult:
    """Perplexity of a GGUF over token windows (n, T), by the same protocol as `perplexity()`."""
    n, seq_len = windows.shape
    runner = GgufRunner(path, n_ctx=max(seq_len, 64), n_batch=max(seq_len, 64), threads=threads)
    start = time.perf_counter()
    nll_sum = 0.0
    try:
        for window in windows.tolist():
            runner.clear()
            logits = runner.decode(window)  # (T, V)
            assert logits is not None
            nll_sum += _nll(logits[:-1], np.asarray(window[1:]))
    finally:
        runner.close()
    predicted = n * (seq_len - 1)
    nll = nll_sum / predicted
    return PerplexityResult(
        dataset=dataset, split=split, seq_len=seq_len, windows=n,
        tokens=text_tokens if text_tokens is not None else windows.numel(), predicted_tokens=predicted,
        nll=nll, ppl=math.exp(nll), wall_s=round(time.perf_counter() - start, 2),
    )


@dataclass(frozen=True)
class GgufSpeed:
    threads: int
    prompt_tokens: int
    new_tokens: int
    prefill_tokens_per_s: float  # median over repeats
    prefill_tokens_per_s_all: list[float]
    decode_tokens_per_s: float
    decode_tokens_per_s_all: list[float]

    def to_record(self) -> dict[str, object]:
        return asdict(self)


def gguf_speed(path: str | Path, *, threads: int = 2, prompt_tokens: int = 512, new_tokens: int = 128,
               repeats: int = 5, seed: int = 0) -> GgufSpeed:
    """llama-bench style: prompt processing of `prompt_tokens` in one batch (pp512), then decoding
    `new_tokens` one token at a time at batch 1 (tg128), random token ids, llama.cpp's default
    cache and attention settings. One warm-up run, then `repeats` timed runs; medians."""
    runner = GgufRunner(path, n_ctx=prompt_tokens + new_tokens + 8, n_batch=prompt_tokens, threads=threads,
                        exact=False)
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, runner.n_vocab, prompt_tokens + new_tokens).tolist()
    prefill, decode = [], []
    try:
        for run in range(repeats + 1):
            runner.clear()
            t0 = time.perf_counter()
            runner.decode(ids[:prompt_tokens], all_logits=False)
            runner.ctx.synchronize()
            t1 = time.perf_counter()
            for i in range(new_tokens):
                runner.decode([ids[prompt_tokens + i]], start=prompt_tokens + i, all_logits=False)
            runner.ctx.synchronize()
            t2 = time.perf_counter()
            if run:  # run 0 warms caches and the thread pool
                prefill.append(prompt_tokens / (t1 - t0))
                decode.append(new_tokens / (t2 - t1))
    finally:
        runner.close()
    return GgufSpeed(threads, prompt_tokens, new_tokens, round(statistics.median(prefill), 2),
                     [round(x, 2) for x in prefill], round(statistics.median(decode), 2),
                     [round(x, 2) for x in decode])
