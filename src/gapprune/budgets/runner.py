"""A runtime's cost table (measured once, cached) and the speed check of a pruned GGUF against the dense one.

The CLI's `--speedup`/`--max-memory` and `benchmarks/budgets.py` share it. Speed is
always measured as a ratio: the dense GGUF and the pruned one timed back to back, several pairs,
median ratio (the cores are shared, so absolute times drift more than their ratio does).
"""

from __future__ import annotations

import logging
import statistics
from pathlib import Path
from typing import Any

from gapprune.budgets.measure import time_gguf
from gapprune.budgets.microbench import (
    BenchSettings,
    fit_costs,
    grid_points,
    measure_points,
)
from gapprune.budgets.table import ModelDims, RuntimeCosts

log = logging.getLogger(__name__)


def cost_file(settings: BenchSettings, runtime: str = "llama.cpp") -> str:
    return f"runtime_costs-{runtime}-{settings.file_type}-t{settings.threads}.json"


def check_shapes(dims: ModelDims) -> dict[str, list[tuple[int, int, int]]]:
    """Whole models the additive prediction is checked on: two uniform prunings and a mixed one."""
    step = max(8, dims.intermediate // 32 // 8 * 8)
    half, third = dims.intermediate - 16 * step, dims.intermediate - 22 * step
    n_rep = dims.n_heads // dims.n_kv_heads
    mixed = [(dims.n_heads, dims.n_kv_heads, dims.intermediate), (n_rep, 1, third), (0, 0, dims.intermediate),
             (dims.n_kv_heads * (n_rep - 1 or 1), dims.n_kv_heads, 0)]
    return {"check/uniform-a": [(dims.n_heads * 2 // 3 // dims.n_kv_heads * dims.n_kv_heads or dims.n_kv_heads,
                                 dims.n_kv_heads, half)] * dims.n_layers,
            "check/uniform-b": [(dims.n_kv_heads, dims.n_kv_heads, dims.intermediate - 8 * step)] * dims.n_layers,
            "check/mixed": [mixed[i % len(mixed)] for i in range(dims.n_layers)]}


def measure_costs(dims: ModelDims, options: dict[str, list[list[int]]], tokenizer_gguf: str | Path,
                  settings: BenchSettings, workdir: Path, key: dict[str, Any], time: bool = True) -> RuntimeCosts:
    """Microbenchmark the grid (or, with time=False, only the memory formulas) into a cost table."""
    if not time:
        return memory_only_costs(dims, options, settings, key)
    checks = check_shapes(dims)
    points, attn, widths, held_out = grid_points(dims, settings, checks)
    workdir.mkdir(parents=True, exist_ok=True)
    times = measure_points(dims, points, tokenizer_gguf, settings, workdir)
    costs = fit_costs(dims, options, times, attn, widths, held_out, checks, key)
    costs.fit["timed"] = True
    return costs


def memory_only_costs(dims: ModelDims, options: dict[str, list[list[int]]], settings: BenchSettings,
                      key: dict[str, Any]) -> RuntimeCosts:
    """A cost table of the memory formulas alone, its times left at zero: what a memory budget reads, in any
    runtime, without timing anything."""
    points, attn, widths, held_out = grid_points(dims, settings, check_shapes(dims))
    times = {name: {"decode_us": 0.0, "prompt_us": 0.0} for name in [*points, "dense"]}
    costs = fit_costs(dims, options, times, attn, widths, held_out, {}, key)
    costs.fit["timed"] = False
    return costs


def default_options(dims: ModelDims, channel_step: int = 0) -> dict[str, list[list[int]]]:
    from gapprune.options import attention_options, default_channel_step, mlp_options

    step = channel_step or default_channel_step(dims.intermediate)
    return {"attn": [list(o) for o in attention_options(dims.n_kv_heads, dims.n_heads // dims.n_kv_heads)],
            "mlp": [[w] for w in mlp_options(dims.intermediate, step)]}


def speed_ratio(dense: Path, pruned: Path, settings: BenchSettings, verify: dict[str, int]) -> dict[str, Any]:
    """Decode (and prompt) speedup of `pruned` over `dense`, timed back to back in pairs; medians."""
    ratios, prompt_ratios, pairs = [], [], []
    for _ in range(verify.get("pairs", 2)):
        t_dense = time_gguf(dense, settings.threads, verify["prompt_tokens"], verify["new_tokens"], verify["repeats"])
        t_pruned = time_gguf(pruned, settings.threads, verify["prompt_tokens"], verify["new_tokens"],
                             verify["repeats"])
        ratios.append(t_dense.decode_us / t_pruned.decode_us)
        prompt_ratios.append(t_dense.prompt_us / t_pruned.prompt_us)
        pairs.append({"dense_decode_us": round(t_dense.decode_us, 1), "pruned_decode_us": round(t_pruned.decode_us, 1)})
    return {"speedup": statistics.median(ratios), "prompt_speedup": statistics.median(prompt_ratios),
            "pairs": pairs}
