"""Measured speed and memory: prefill latency, decode tokens/s, peak memory, parameters.

Each measurement runs warm-up passes first, then several repetitions; the median and the spread
(min, max) are reported. Decoding uses the KV cache, one new token per step, greedy.
"""

from __future__ import annotations

import gc
import inspect
import resource
import statistics
import time
from dataclasses import asdict, dataclass

import torch
from transformers import PreTrainedModel

from gapprune.evaluate.timing import synchronize, timed_runs


@dataclass(frozen=True)
class SpeedResult:
    batch: int
    prompt_tokens: int
    new_tokens: int
    prefill_ms: float
    prefill_ms_min: float
    prefill_ms_max: float
    decode_tokens_per_s: float
    decode_tokens_per_s_min: float
    decode_tokens_per_s_max: float
    peak_mem_mb: float
    weights_mb: float
    params: int

    def to_record(self) -> dict[str, object]:
        return asdict(self)


def _peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # process peak RSS (KiB on Linux)


@torch.inference_mode()
def measure_speed(
    model: PreTrainedModel, *, batch: int = 1, prompt_tokens: int = 512, new_tokens: int = 32, warmup: int = 1,
    repeats: int = 3, seed: int = 0,
) -> SpeedResult:
    """Prefill of `prompt_tokens` and decoding of `new_tokens` at `batch`."""
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, int(model.config.vocab_size), (batch, prompt_tokens), generator=generator).to(device)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    def prefill() -> None:
        model(input_ids=ids, use_cache=False, logits_to_keep=1)

    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def decode_seconds() -> float:
        """Prefill with the cache (untimed), then time `new_tokens` single-token steps."""
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        cache, token = getattr(out, "cache", None) or out.past_key_values, out.logits[:, -1:].argmax(-1)
        synchronize(device)
        start = time.perf_counter()
        for _ in range(new_tokens):
            out = model(input_ids=token, use_cache=True, **{cache_kw: cache})
            cache, token = getattr(out, "cache", None) or out.past_key_values, out.logits[:, -1:].argmax(-1)
        synchronize(device)
        return time.perf_counter() - start

    prefill_s = timed_runs(prefill, warmup=warmup, repeats=repeats, device=device)
    for _ in range(warmup):
        decode_seconds()
    rates = sorted(batch * new_tokens / decode_seconds() for _ in range(repeats))
    prefill_med = statistics.median(prefill_s)
    return SpeedResult(
        batch=batch, prompt_tokens=prompt_tokens, new_tokens=new_tokens,
        prefill_ms=round(1000 * prefill_med, 2), prefill_ms_min=round(1000 * min(prefill_s), 2),
        prefill_ms_max=round(1000 * max(prefill_s), 2),
        decode_tokens_per_s=round(statistics.median(rates), 2), decode_tokens_per_s_min=round(rates[0], 2),
        decode_tokens_per_s_max=round(rates[-1], 2),
        peak_mem_mb=round(_peak_memory_mb(device), 1),
        weights_mb=round(sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20, 1),
        params=sum(p.numel() for p in model.parameters()),
    )
