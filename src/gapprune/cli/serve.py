"""`gapprune bench DIR --runtime vllm [--vs DENSE] [--parity]`: serve folders in vLLM and measure them."""

from __future__ import annotations

import argparse
import json
import shlex
from typing import Any

THROUGHPUT_PROMPT_TOKENS = 32
PARITY_PROMPTS, PARITY_PROMPT_TOKENS, PARITY_NEW_TOKENS = 16, 32, 64
PARITY_WINDOWS, PARITY_SEQ_LEN = 64, 128


def bench_in_vllm(args: argparse.Namespace) -> int:
    import torch

    from gapprune.evaluate.serving import (
        describe,
        parity_inputs,
        parity_record,
        serve_and_measure,
        serving_records,
        speedups,
        transformers_side,
    )
    from gapprune.models.loading import resolve_model_source
    from gapprune.output import check_output, write_file_atomically
    from gapprune.serving.vllm_runtime import check_servable, find_vllm

    specs = [args.model] + ([args.vs] if args.vs else [])
    folders = [resolve_model_source(spec) for spec in specs]  # an alias or a .gguf serves from its dequantised folder
    for folder in folders:  # refuse a bad folder before a minute of engine start
        check_servable(folder, args.tp)
    if args.out:
        check_output(args.out, overwrite=True, kind="file")
    env = find_vllm(args.vllm_python)
    batches = [int(b) for b in (args.batches or "1,16,64").split(",")]
    new_tokens = args.new_tokens or 64
    command = " ".join(shlex.quote(a) for a in args.command_line)
    prompt = torch.randint(0, 1000, (THROUGHPUT_PROMPT_TOKENS,), generator=torch.Generator().manual_seed(0)).tolist()
    records: list[dict[str, Any]] = []
    for spec, folder in zip(specs, folders):
        parity = reference = None
        if args.parity:
            from transformers import AutoTokenizer

            parity = parity_inputs(AutoTokenizer.from_pretrained(folder), args.data_dir, prompts=PARITY_PROMPTS,
                                   prompt_tokens=PARITY_PROMPT_TOKENS, windows=PARITY_WINDOWS, seq_len=PARITY_SEQ_LEN)
            reference = transformers_side(folder, parity[0], parity[1], PARITY_NEW_TOKENS)
        answer = serve_and_measure(
            env, folder, batches=batches, new_tokens=new_tokens, ttft_tokens=args.prompt_tokens,
            throughput_prompt=prompt, repeats=args.repeats, parity=parity, parity_tokens=PARITY_NEW_TOKENS,
            tensor_parallel=args.tp,
        )
        about = describe(folder, given=spec)
        served = serving_records(answer, about, env, new_tokens=new_tokens, command=command)
        records += served
        if parity is not None and reference is not None:
            check = parity_record(answer, reference, parity[1], about, env, command)
            records.append(check)
            print(f"{spec}: greedy identical on {check['greedy_identical']} of {check['prompts']} prompts; "
                  f"ppl vLLM {check['ppl_vllm']:.4f} vs transformers {check['ppl_transformers']:.4f} "
                  f"({100 * check['ppl_rel_diff']:+.4f}%)")
    for line in speedups([r for r in records if r["kind"] == "serving"], specs[1] if args.vs else ""):
        print(line)
    if args.out:
        write_file_atomically(args.out, json.dumps(records, indent=1) + "\n")
    return 0
