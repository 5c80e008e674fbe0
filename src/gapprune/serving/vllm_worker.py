"""Measurements inside a vLLM process: greedy text, prompt log-probabilities, throughput, time to first token.

vLLM pins its own transformers, so it often lives in its own Python environment: gapprune's side
(`runtimes.vllm`) writes a job as JSON, runs `python -m gapprune.serving.vllm_worker JOB OUT` with that
environment's interpreter, and reads the answers back. This module imports only vLLM and the standard
library, and one engine answers every task of a job (an engine start costs about a minute on a CPU).

A job: {"model": folder, "dtype": "float32", "enforce_eager": true, "max_model_len": int,
        "tensor_parallel_size": int, "skip_tokenizer_init": bool, "load_format": "auto" | "dummy", "tasks": [task, ...]}, or {"jobs": [job, ...]}
for several folders in one process; either may carry "env": {name: value} for vLLM's environment
variables (e.g. VLLM_CPU_KVCACHE_SPACE), set before vLLM is imported. Tasks:
    {"kind": "generate", "prompts": [[ids]], "max_tokens": int, "stop": [str]?, "progress": bool?}
                                                                          -> {"tokens": [[ids]], "texts"?: [str]}
    {"kind": "prompt_logprobs", "windows": [[ids]]}                       -> {"logprobs": [[float]]}
    {"kind": "throughput", "batches": [int], "prompt": [ids], "new_tokens": int, "repeats": int}
                                                                          -> {"runs": [{batch, tokens_per_s}]}
    {"kind": "ttft", "prompt": [ids], "repeats": int}                     -> {"ttft_ms": float}
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def _engine(job: dict[str, Any]) -> Any:
    from vllm import LLM

    return LLM(
        model=job["model"], dtype=job.get("dtype", "float32"), enforce_eager=job.get("enforce_eager", True),
        max_model_len=job.get("max_model_len", 2048), tensor_parallel_size=job.get("tensor_parallel_size", 1),
        seed=0, disable_log_stats=True, skip_tokenizer_init=job.get("skip_tokenizer_init", False),
        load_format=job.get("load_format", "auto"),  # "dummy": random weights, for timing shapes without files
    )


def _prompts(ids: list[list[int]]) -> list[Any]:
    from vllm.inputs import TokensPrompt

    return [TokensPrompt(prompt_token_ids=list(p)) for p in ids]


def _progress_bar(wanted: bool) -> Any:
    """vLLM's bar drawn on the caller's stderr (`GAPPRUNE_PROGRESS_FD`) rather than in the log with the rest."""
    fd = os.environ.get("GAPPRUNE_PROGRESS_FD")
    if not wanted or fd is None:
        return wanted
    from functools import partial

    from tqdm import tqdm

    return partial(tqdm, file=os.fdopen(int(fd), "w", closefd=False))


def generate(llm: Any, task: dict[str, Any]) -> dict[str, Any]:
    """Greedy continuations; with "stop" strings, also their text, cut before the first stop."""
    from vllm import SamplingParams

    stop = task.get("stop")
    params = SamplingParams(temperature=0.0, max_tokens=task["max_tokens"], stop=stop, detokenize=bool(stop))
    outputs = llm.generate(_prompts(task["prompts"]), params, use_tqdm=_progress_bar(task.get("progress", False)))
    answer: dict[str, Any] = {"tokens": [list(o.outputs[0].token_ids) for o in outputs]}
    if stop:
        answer["texts"] = [o.outputs[0].text for o in outputs]
    return answer


def prompt_logprobs(llm: Any, task: dict[str, Any]) -> dict[str, Any]:
    """Log-probability of every window token after the first, from the prompt pass alone."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0, detokenize=False)
    outputs = llm.generate(_prompts(task["windows"]), params, use_tqdm=False)
    result = []
    for window, out in zip(task["windows"], outputs):
        entries = out.prompt_logprobs[1:]  # position 0 has no prediction
        result.append([entry[token].logprob for token, entry in zip(window[1:], entries)])
    return {"logprobs": result}


def throughput(llm: Any, task: dict[str, Any]) -> dict[str, Any]:
    """Generated tokens per second for a batch of identical-length requests that all run to `new_tokens`."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=task["new_tokens"], min_tokens=task["new_tokens"],
                            ignore_eos=True)
    runs = []
    for batch in task["batches"]:
        prompts = _prompts([task["prompt"]] * batch)
        llm.generate(prompts[:1], params, use_tqdm=False)  # warm-up
        times = []
        for _ in range(task.get("repeats", 1)):
            start = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False)
            times.append(time.perf_counter() - start)
        runs.append({"batch": batch, "tokens_per_s": batch * task["new_tokens"] / statistics.median(times),
                     "seconds": times})
    return {"runs": runs}


def ttft(llm: Any, task: dict[str, Any]) -> dict[str, Any]:
    """Time to the first token of one request: its whole prefill plus one sampling step."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=1)
    prompt = _prompts([task["prompt"]])
    llm.generate(prompt, params, use_tqdm=False)  # warm-up
    times = []
    for _ in range(task.get("repeats", 3)):
        start = time.perf_counter()
        llm.generate(prompt, params, use_tqdm=False)
        times.append(time.perf_counter() - start)
    return {"ttft_ms": 1000 * statistics.median(times)}


TASKS = {"generate": generate, "prompt_logprobs": prompt_logprobs, "throughput": throughput, "ttft": ttft}


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    import vllm

    unknown = [t["kind"] for t in job["tasks"] if t["kind"] not in TASKS]
    if unknown:
        raise ValueError(f"unknown task kinds {unknown}; known: {sorted(TASKS)}")
    start = time.perf_counter()
    llm = _engine(job)
    load_s = time.perf_counter() - start
    results = [TASKS[t["kind"]](llm, t) for t in job["tasks"]]
    ranks = llm.llm_engine.vllm_config.parallel_config.tensor_parallel_size  # what the engine ran, not what was asked
    del llm  # shut the engine down before the next one (or the exit) starts
    return {"vllm_version": vllm.__version__, "load_s": load_s, "tensor_parallel_size": ranks, "results": results}


def run_jobs(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Several folders in one process, one engine at a time (vLLM's imports are paid once)."""
    import gc

    answers = []
    for job in jobs:
        answers.append(run_job(job))
        gc.collect()
    return answers


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m gapprune.serving.vllm_worker JOB.json OUT.json", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text())
    os.environ.update(job.get("env", {}))  # vLLM reads its settings (KV-cache size, processes) at import
    answer: Any = run_jobs(job["jobs"]) if "jobs" in job else run_job(job)
    Path(argv[1]).write_text(json.dumps(answer))
    sys.stdout.flush()
    sys.stderr.flush()
    # the engines have shut down; vLLM 0.32's CPU build can abort in its threads' teardown at interpreter exit
    # ("terminate called without an active exception"), after the answer is safe: end here instead
    os._exit(0)


if __name__ == "__main__":  # vLLM spawns processes that re-import the main module
    sys.exit(main(sys.argv[1:]))
