"""Measure a GGUF in llama.cpp: decode and prompt time per token, and the memory llama.cpp allocates.

Times: one warm-up, then every decoded token timed alone; a low quantile of them (the cores are shared).
Memory is read from llama.cpp's own log lines while a context of the requested length is created:
the model buffer (weights as loaded) and the KV buffer, so "fits in 250 MB" is checked against what
llama.cpp allocates rather than against our formula.
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

MIB = 1024 * 1024
_BUFFER = re.compile(r"(\w+) (KV|model|compute) buffer size =\s+([0-9.]+) MiB")


@dataclass(frozen=True)
class Timing:
    """Per-token times in microseconds (medians) and the settings they were measured at."""

    decode_us: float
    prompt_us: float
    threads: int
    prompt_tokens: int
    new_tokens: int
    repeats: int
    decode_us_all: list[float]

    def to_record(self) -> dict[str, object]:
        return asdict(self)


def time_gguf(path: str | Path, threads: int = 1, prompt_tokens: int = 32, new_tokens: int = 32,
              repeats: int = 3, quantile: float = 0.5, cpu_time: bool = True) -> Timing:
    """Decode µs per token at batch 1 (after a `prompt_tokens` prompt) and prompt µs per token.

    One warm-up run, then `repeats` runs of a prompt in one batch and `new_tokens` single-token
    decodes, each timed alone. With one thread ggml computes on the calling thread, so the process's
    CPU time (`cpu_time`) is the time the model took without the time other jobs held the core
    (wall time on a shared machine mixes in their load). Estimates: the median token, the fastest prompt.
    """
    from gapprune.evaluate.llamacpp import GgufRunner

    clock = time.process_time if cpu_time else time.perf_counter

    runner = GgufRunner(path, n_ctx=prompt_tokens + new_tokens + 8, n_batch=max(prompt_tokens, 1), threads=threads,
                        exact=False)
    ids = np.random.default_rng(0).integers(0, runner.n_vocab, prompt_tokens + new_tokens).tolist()
    decode: list[float] = []
    prompt: list[float] = []
    try:
        for run in range(repeats + 1):
            runner.clear()
            t0 = clock()
            runner.decode(ids[:prompt_tokens], all_logits=False)
            runner.ctx.synchronize()
            if run:
                prompt.append((clock() - t0) / prompt_tokens)
            for i in range(new_tokens):
                t0 = clock()
                runner.decode([ids[prompt_tokens + i]], start=prompt_tokens + i, all_logits=False)
                runner.ctx.synchronize()
                if run:
                    decode.append(clock() - t0)
    finally:
        runner.close()
    per_run = [1e6 * float(np.median(decode[r * new_tokens:(r + 1) * new_tokens])) for r in range(repeats)]
    return Timing(1e6 * float(np.quantile(decode, quantile)), 1e6 * min(prompt), threads, prompt_tokens, new_tokens,
                  repeats, [round(x, 1) for x in per_run])


@dataclass(frozen=True)
class Allocated:
    """What llama.cpp allocated for a model and a context: bytes of weights, KV cache and compute buffers.

    Weights are exact (the model's size); KV and compute come from llama.cpp's log, which prints MiB
    with two decimals, so they are good to about ±5 kB: plenty for real models, coarse for toy ones.
    """

    model_bytes: int
    kv_bytes: int
    compute_bytes: int
    context: int

    @property
    def total_bytes(self) -> int:
        """Weights + KV cache: what the memory budget counts (compute buffers are reported, not budgeted)."""
        return self.model_bytes + self.kv_bytes


def llamacpp_memory(path: str | Path, context: int) -> Allocated:
    """Create a context of `context` cells (llama.cpp defaults: f16 cache) and read the buffer sizes it logs."""
    from gapprune.llamacpp_binding import import_cyllama

    cy = import_cyllama()
    lines: list[str] = []
    cy.set_log_callback(lambda level, text: lines.append(text))
    try:
        cy.llama_backend_init()
        model = cy.LlamaModel(str(path), cy.LlamaModelParams())
        params = cy.LlamaContextParams()
        params.n_ctx, params.n_threads, params.n_threads_batch = context, 1, 1
        ctx = cy.LlamaContext(model, params)
        model_bytes = int(model.size)
        ctx.close()
        model.close()
    finally:
        cy.disable_logging()
    sizes: dict[str, float] = {}
    for match in _BUFFER.finditer("".join(lines)):
        sizes[match.group(2)] = sizes.get(match.group(2), 0.0) + float(match.group(3))
    return Allocated(model_bytes, round(sizes.get("KV", 0.0) * MIB), round(sizes.get("compute", 0.0) * MIB), context)
