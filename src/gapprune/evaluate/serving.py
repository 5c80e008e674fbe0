"""Serve a folder in vLLM and measure it: throughput and time to first token, and parity with transformers.

One vLLM engine per folder answers every question (an engine start costs about a minute on a CPU):
generation throughput at each batch size, time to the first token of a long prompt, and, with `parity`,
greedy continuations of real prompts (compared token by token with transformers' `generate`) and the
prompt log-probabilities of perplexity windows (compared with `gapprune ppl` on the same windows).
"""

from __future__ import annotations

import datetime
import json
import math
import platform
from pathlib import Path
from typing import Any, cast

import torch

from gapprune.serving.vllm_runtime import (
    SERVING_KV_CACHE_GIB,
    VllmEnvironment,
    check_servable,
    engine_env,
    run_job,
)

Record = dict[str, Any]


def machine_line() -> str:
    from gapprune.evaluate.run_record import processor_name

    return f"{platform.machine()} CPU ({processor_name()}), {torch.get_num_threads()} cores"


def describe(folder: str | Path, given: str | None = None) -> Record:
    """What a folder is: the model it came from, the method and ratio (dense when it has no plan.json).

    `given` is what the user named (a folder, an alias, a .gguf file); records carry it rather than the folder it
    resolved to, which for an alias is a cache path of this machine that says nothing elsewhere."""
    folder = Path(folder)
    shown = given or str(folder)
    plan_file = folder / "plan.json"
    if not plan_file.is_file():
        name = given if given and not Path(given).is_dir() else folder.name
        return {"model": name, "folder": shown, "method": "dense", "ratio": 0.0, "ratio_of": "model"}
    plan = json.loads(plan_file.read_text())
    summary, config = plan["summary"], plan["config"]
    return {"model": source_model(folder), "folder": shown, "method": summary.get("allocator", "gap"),
            "ratio": config.get("ratio"), "ratio_of": config.get("ratio_of", "model"),
            "calibration": config.get("calib"), "achieved_ratio": summary.get("achieved_ratio")}


def source_model(folder: Path) -> str:
    """The model a pruned folder came from, as its prune command named it (`run.json`), else the folder's name."""
    run_file = folder / "run.json"
    words = json.loads(run_file.read_text()).get("command", "").split() if run_file.is_file() else []
    return words[words.index("prune") + 1] if "prune" in words[:-1] else folder.name


def parity_inputs(tokenizer: Any, data_dir: str | None, *, prompts: int, prompt_tokens: int, windows: int,
                  seq_len: int) -> tuple[list[list[int]], torch.Tensor]:
    """Greedy prompts (the first `prompts` windows of WikiText-2's validation text) and the perplexity windows
    `gapprune ppl --dataset wikitext2 --seq-len seq_len --max-windows windows` reads."""
    from gapprune.data import bos_token_id, consecutive_windows, load_text, tokenize_text

    bos = bos_token_id(tokenizer)
    validation = tokenize_text(load_text("wikitext2", "validation", data_dir), tokenizer)
    prompt_ids = consecutive_windows(validation, prompt_tokens, prompts, bos_id=bos).tolist()
    test = tokenize_text(load_text("wikitext2", "test", data_dir), tokenizer)
    return prompt_ids, consecutive_windows(test, seq_len, windows, bos_id=bos)


def transformers_side(folder: str, prompts: list[list[int]], windows: torch.Tensor, new_tokens: int) -> Record:
    """Greedy continuations (one prompt at a time: no padding; up to `new_tokens` or the end-of-sequence token,
    where vLLM stops too) and the perplexity, in float32 transformers."""
    from gapprune.evaluate.perplexity import perplexity
    from gapprune.models.loading import load_model

    model, tokenizer = load_model(folder, dtype="float32")
    pad = tokenizer.pad_token_id if tokenizer is not None else 0
    continuations = []
    with torch.inference_mode():
        for ids in prompts:
            out = cast(Any, model).generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False,
                                            pad_token_id=pad)
            continuations.append(out[0, len(ids):].tolist())
    ppl = perplexity(model, windows, dataset="wikitext2", split="test", progress=False)
    return {"tokens": continuations, "ppl": ppl.ppl}


def serve_and_measure(
    env: VllmEnvironment, folder: str, *, batches: list[int], new_tokens: int, ttft_tokens: int,
    throughput_prompt: list[int], repeats: int, parity: tuple[list[list[int]], torch.Tensor] | None,
    parity_tokens: int, tensor_parallel: int = 1, log: Path | None = None,
) -> Record:
    """One vLLM engine on `folder`: throughput per batch, time to first token, and the parity answers."""
    config = check_servable(folder, tensor_parallel)
    vocab = int(config.get("vocab_size", 32000))
    ttft_prompt = [int(t) % vocab for t in torch.randint(0, vocab, (ttft_tokens,), generator=torch.Generator()
                                                        .manual_seed(0)).tolist()]
    throughput_prompt = [t % vocab for t in throughput_prompt]  # ids that exist in a small vocabulary too
    tasks: list[Record] = [
        {"kind": "throughput", "batches": batches, "prompt": throughput_prompt, "new_tokens": new_tokens,
         "repeats": repeats},
        {"kind": "ttft", "prompt": ttft_prompt, "repeats": repeats},
    ]
    if parity is not None:
        tasks += [{"kind": "generate", "prompts": parity[0], "max_tokens": parity_tokens},
                  {"kind": "prompt_logprobs", "windows": parity[1].tolist()}]
    longest = max(ttft_tokens + 8, len(throughput_prompt) + new_tokens + 8,
                  max(len(p) for p in parity[0]) + parity_tokens + 8 if parity is not None else 0,
                  parity[1].shape[1] + 8 if parity is not None else 0)
    positions = config.get("max_position_embeddings")
    if positions is not None and longest > positions:
        raise ValueError(f"{folder} holds {positions} positions and this bench needs {longest} (a {ttft_tokens}-token "
                         f"prompt for the first token, {new_tokens} new tokens); pass a smaller --prompt-tokens or "
                         "--new-tokens")
    job = {"model": str(folder), "dtype": "float32", "enforce_eager": True, "max_model_len": longest,
           "tensor_parallel_size": tensor_parallel, "tasks": tasks,
           # 4 GiB of KV cache holds batch 64 many times
           "env": engine_env(SERVING_KV_CACHE_GIB, tensor_parallel=tensor_parallel)}
    return run_job(env, job, log=log)


def serving_records(answer: Record, about: Record, env: VllmEnvironment, *, new_tokens: int, command: str) -> list[Record]:
    """`kind: serving` records, one per batch size, each carrying the folder's time to first token."""
    throughput, ttft = answer["results"][0], answer["results"][1]
    common = {"runtime": "vllm", "vllm_version": env.vllm_version, "dtype": "float32", "enforce_eager": True,
              "kv_cache_gib": SERVING_KV_CACHE_GIB, "tensor_parallel": answer["tensor_parallel_size"],
              "new_tokens": new_tokens, "ttft_ms": round(ttft["ttft_ms"], 1), "machine": machine_line(),
              "command": command, "date": datetime.date.today().isoformat()}
    return [{"kind": "serving", **about, "batch": run["batch"], "tokens_per_s": round(run["tokens_per_s"], 2),
             **common} for run in throughput["runs"]]


def parity_record(answer: Record, reference: Record, windows: torch.Tensor, about: Record, env: VllmEnvironment,
                  command: str) -> Record:
    """Greedy tokens identical prompt by prompt, and the perplexity from vLLM's prompt log-probabilities."""
    generated, logprobs = answer["results"][2]["tokens"], answer["results"][3]["logprobs"]
    identical = sum(a == b for a, b in zip(generated, reference["tokens"]))
    nll = -math.fsum(lp for window in logprobs for lp in window) / sum(len(w) for w in logprobs)
    ppl = math.exp(nll)
    return {"kind": "serving_parity", **about, "runtime": "vllm", "vllm_version": env.vllm_version,
            "tensor_parallel": answer["tensor_parallel_size"], "dtype": "float32", "prompts": len(generated),
            "new_tokens": len(generated[0]) if generated else 0,
            "greedy_identical": identical, "windows": int(windows.shape[0]), "seq_len": int(windows.shape[1]),
            "ppl_vllm": round(ppl, 4), "ppl_transformers": round(reference["ppl"], 4),
            "ppl_rel_diff": round(ppl / reference["ppl"] - 1, 6), "machine": machine_line(), "command": command,
            "date": datetime.date.today().isoformat()}


def speedups(records: list[Record], dense_folder: str) -> list[str]:
    """Lines of pruned throughput against the dense folder's, batch by batch."""
    dense = {r["batch"]: r["tokens_per_s"] for r in records if r["folder"] == dense_folder}
    lines = []
    for r in records:
        extra = ""
        if r["folder"] != dense_folder and r["batch"] in dense:
            extra = f"  {r['tokens_per_s'] / dense[r['batch']]:.2f}x dense"
        lines.append(f"{r['folder']} (vLLM {r['vllm_version']}) batch {r['batch']}: {r['tokens_per_s']:.1f} tok/s, "
                     f"first token of {r['ttft_ms']:.0f} ms{extra}")
    return lines
