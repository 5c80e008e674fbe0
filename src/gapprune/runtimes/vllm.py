"""vLLM: costs from timing whole models of one shape per layer, served by vLLM through gapprune's plugin with
random weights (`load_format="dummy"`: a config.json is all a shape needs); a budget is verified by serving the
pruned folder beside the dense model.

Every grid point is the one `budgets/microbench.py` times in llama.cpp (attention only at each head count, MLP
only at each width, checks of mixed shapes). vLLM needs an attention layer somewhere, so a point without any
keeps one query and one KV head in layer 0 (the base point too, so the difference stays the MLP's). Each engine
start costs seconds, so the dense shape is timed once every `REFERENCE_EVERY` points, not beside each one, and
every point's time is kept as a ratio to the mean of the dense times around it (the cores are shared).
Times are of batch-1 generation in one process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), float32, eager: the way
`--verify` measures. Memory columns follow the formulas at float32; this runtime counts speedups only.
"""

from __future__ import annotations

import json
import logging
import statistics
from pathlib import Path
from typing import Any, ClassVar

from gapprune.budget import RuntimeBudget, SpeedupBudget
from gapprune.budgets.microbench import BenchSettings, Shapes, fit_costs, grid_points
from gapprune.budgets.runner import check_shapes, memory_only_costs
from gapprune.budgets.table import ModelDims, RuntimeCosts
from gapprune.runtimes.base import RUNTIMES, Runtime, Verification
from gapprune.serving.vllm_runtime import engine_env, find_vllm, run_job

log = logging.getLogger(__name__)
REFERENCE_EVERY = 4
ENGINE_ENV = engine_env(1, in_process=True)
SPEED_CHECK = {"new_tokens": 64, "repeats": 3, "pairs": 2}


def with_anchor(shapes: Shapes) -> Shapes:
    """`shapes`, with one query and one KV head in layer 0 when no layer keeps attention."""
    if any(heads for heads, _, _ in shapes):
        return shapes
    return [(1, 1, shapes[0][2]), *shapes[1:]]


def shape_config(config: dict[str, Any], shapes: Shapes) -> dict[str, Any]:
    """The model's config.json naming gapprune's per-layer class, with these (heads, KV heads, width) per layer."""
    arch = (config.get("architectures") or ["LlamaForCausalLM"])[0].removeprefix("Gappruned")
    layers = [{"num_attention_heads": h, "num_key_value_heads": kv, "intermediate_size": w} for h, kv, w in shapes]
    return {**config, "architectures": [f"Gappruned{arch}"], "layer_shapes": layers}


def timing_job(folder: Path, prompt: list[int], new_tokens: int, repeats: int, *, dummy: bool) -> dict[str, Any]:
    return {"model": str(folder), "dtype": "float32", "enforce_eager": True,
            "max_model_len": len(prompt) + new_tokens + 8, "skip_tokenizer_init": True,
            "load_format": "dummy" if dummy else "auto",
            "tasks": [{"kind": "throughput", "batches": [1], "prompt": prompt, "new_tokens": new_tokens,
                       "repeats": repeats}]}


def decode_us(answer: dict[str, Any], new_tokens: int) -> float:
    """Microseconds per generated token at batch 1, from the fastest repeat: other jobs on the cores only ever
    slow a run down."""
    return 1e6 * min(answer["results"][0]["runs"][0]["seconds"]) / new_tokens


@RUNTIMES.register("vllm")
class Vllm(Runtime):
    name: ClassVar[str] = "vllm"
    budgets: ClassVar[tuple[type[RuntimeBudget], ...]] = (SpeedupBudget,)
    measures: ClassVar[str] = "the output folder, served by vLLM"

    @classmethod
    def settings_for(cls, tensor_type: str, threads: int) -> BenchSettings:
        # vLLM's CPU build serves float32 here; threads are vLLM's own (every core it binds)
        return BenchSettings(file_type="f32", threads=threads, prompt_tokens=8, new_tokens=32, repeats=3)

    def _run(self, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        answer: list[dict[str, Any]] = run_job(find_vllm(), {"jobs": jobs, "env": ENGINE_ENV})
        return answer

    def measure_costs(self, model_spec: str, dims: ModelDims, options: dict[str, list[list[int]]], workdir: Path,
                      key: dict[str, Any], timed: bool) -> RuntimeCosts:
        from transformers import AutoConfig

        from gapprune.models.loading import resolve_model_source
        from gapprune.serving.vllm_runtime import check_servable

        if not timed:
            return memory_only_costs(dims, options, self.settings, key)
        checks = check_shapes(dims)
        points, attn, widths, held_out = grid_points(dims, self.settings, checks)
        times: dict[str, dict[str, Any]] = {}
        config = AutoConfig.from_pretrained(resolve_model_source(model_spec)).to_dict()
        dense: Shapes = [(dims.n_heads, dims.n_kv_heads, dims.intermediate)] * dims.n_layers
        names = list(points)
        order: list[str] = []
        for start in range(0, len(names), REFERENCE_EVERY):
            order += ["dense", *names[start:start + REFERENCE_EVERY]]
        order.append("dense")
        prompt = [(7 * i + 3) % dims.vocab for i in range(self.settings.prompt_tokens)]
        jobs = []
        for i, name in enumerate(order):
            folder = workdir / f"{i:03d}"
            folder.mkdir(parents=True)
            shapes = dense if name == "dense" else with_anchor(points[name])
            (folder / "config.json").write_text(json.dumps(shape_config(config, shapes)))
            check_servable(folder)
            jobs.append(timing_job(folder, prompt, self.settings.new_tokens, self.settings.repeats, dummy=True))
        log.info("timing %d model shapes in vLLM (one engine each)", len(jobs))
        timed_us = [decode_us(a, self.settings.new_tokens) for a in self._run(jobs)]
        references = [t for name, t in zip(order, timed_us) if name == "dense"]
        reference = statistics.median(references)
        around = 0  # the dense times before and after each group of points
        for name, t in zip(order, timed_us):
            if name == "dense":
                around += 1
                continue
            local = (references[around - 1] + references[around]) / 2
            times[name] = {"decode_us": t / local * reference, "prompt_us": 0.0}
        times["dense"] = {"decode_us": reference, "prompt_us": 0.0,
                          "decode_us_spread": [min(references), max(references)]}
        costs = fit_costs(dims, options, times, attn, widths, held_out, checks, key)
        costs.fit.update(timed=True, engine_env=ENGINE_ENV, anchor="one query and one KV head in layer 0 where "
                         "a point keeps no attention")
        return costs

    def dense_reference(self, model: Any, tokenizer: Any, model_spec: str, gguf: str | None,
                        workdir: Path) -> Path:
        if (Path(model_spec) / "config.json").is_file():
            return Path(model_spec)
        folder = workdir / "dense"
        model.save_pretrained(folder)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        return folder

    def measure_speedup(self, reference: Path, folder: Path, gguf: str | None) -> Verification:
        vocab = int(json.loads((Path(folder) / "config.json").read_text()).get("vocab_size", 32000))
        prompt = [(7 * i + 3) % vocab for i in range(self.settings.prompt_tokens)]
        jobs = [timing_job(path, prompt, SPEED_CHECK["new_tokens"], SPEED_CHECK["repeats"], dummy=False)
                for _ in range(SPEED_CHECK["pairs"]) for path in (reference, folder)]
        answers = self._run(jobs)
        new = SPEED_CHECK["new_tokens"]
        pairs = [{"dense_decode_us": round(decode_us(d, new), 1), "pruned_decode_us": round(decode_us(p, new), 1)}
                 for d, p in zip(answers[::2], answers[1::2])]
        speedup = statistics.median(p["dense_decode_us"] / p["pruned_decode_us"] for p in pairs)
        return Verification(speedup, {"speedup": speedup, "pairs": pairs, "vllm_version": answers[0]["vllm_version"],
                                      "engine_env": ENGINE_ENV, "check": SPEED_CHECK})
