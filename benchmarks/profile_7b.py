"""Measured cost of profiling a 7B-shaped model on one GPU, and the projected full exact-profile time.

Builds a randomly initialised Llama-2-7B-shaped model (hidden 4096, 32 heads, MLP 11008, vocab
32000, 32 layers) in bf16 on the device (timing does not depend on the weights' values), captures
`--tokens` random calibration tokens, then measures:

* one decoder layer forward and the LM head + KL on those tokens (the cost model's units);
* one replay of the reference profiler (one option, full logits) from layer 0;
* the batched exact profiler on a few layers (per-option seconds as a function of the start layer);
* the Fisher profiler on the whole model (one forward + backward per batch).

The exact profile replays, for each of the K measured options of layer l, layers l...L and the head:

    exact_s ≈ Σ_l K · t(l),   t(l) = a · (L − l) + b   (fitted on the measured layers)

    python benchmarks/profile_7b.py --device cuda --out docs/results/profile_7b.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from gapprune.config import PruneConfig
from gapprune.engine.capture import move_kwargs, run_layer
from gapprune.engine.head import dense_reference
from gapprune.engine.replay import replay_metric
from gapprune.evaluate.timing import median_seconds, synchronize
from gapprune.options import default_channel_step
from gapprune.pipeline import calibrate_on
from gapprune.profiling.batched import build_loss_table_batched
from gapprune.profiling.fisher import build_loss_table_fisher
from gapprune.profiling.loss_table import option_grid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=32)
    parser.add_argument("--intermediate", type=int, default=11008)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--profile-layers", default="0,16,30", help="layers the batched profiler is timed on")
    parser.add_argument("--mlp-stride", type=int, default=4)
    parser.add_argument("--max-rows", type=int, default=16384)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    record: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "dtype": args.dtype,
                    "torch": torch.__version__, "tokens": args.tokens, "layers": args.layers, "hidden": args.hidden,
                    "intermediate": args.intermediate, "vocab": args.vocab, "heads": args.heads, "kv_heads": args.kv_heads}
    config = LlamaConfig(hidden_size=args.hidden, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                         intermediate_size=args.intermediate, vocab_size=args.vocab, num_hidden_layers=args.layers,
                         max_position_embeddings=4096, tie_word_embeddings=False)
    config.architectures = ["LlamaForCausalLM"]
    start = time.perf_counter()
    torch.set_default_dtype(dtype)
    with torch.device(device):
        model = LlamaForCausalLM(config).eval()
    torch.set_default_dtype(torch.float32)
    record["build_s"] = round(time.perf_counter() - start, 2)
    ids = torch.randint(0, args.vocab, (args.tokens // args.seq_len, args.seq_len), generator=torch.Generator().manual_seed(0))
    n = ids.shape[0]
    config = PruneConfig(ratio=0.5, calib_samples=n, profile_samples=n, seq_len=args.seq_len, batch_size=n,
                         compensate="none", device=args.device)
    calibration = calibrate_on(model, ids, config)
    adapter, inputs, scores = calibration.adapter, calibration.inputs, calibration.scores
    record["capture_s"] = round(calibration.timings["capture"], 2)

    with torch.inference_mode():
        hidden = inputs.hidden[0][0].to(device, dtype)
        kwargs = move_kwargs(inputs.kwargs[0][0], device)
        record["layer_s"] = round(median_seconds(lambda: run_layer(adapter.layers[0], hidden, kwargs), repeats=5,
                                                   device=device), 5)
        reference = dense_reference(adapter, inputs, "kl", device)
        record["reference_replay_from_layer0_s"] = round(
            median_seconds(lambda: replay_metric(adapter, inputs, 0, "kl", reference, device), device=device), 4)
    step = default_channel_step(args.intermediate)
    layers = [int(x) for x in args.profile_layers.split(",")]
    build_loss_table_batched(adapter, inputs, scores, channel_step=step, mlp_stride=args.mlp_stride, layers=layers[:1],
                             max_rows=args.max_rows, progress=False)  # warm-up
    table = build_loss_table_batched(adapter, inputs, scores, channel_step=step, mlp_stride=args.mlp_stride,
                                     layers=layers, max_rows=args.max_rows, progress=False)
    measured = sum(len(v) - 1 for v in option_grid(adapter, step, args.mlp_stride).measured.values())
    per_option = {int(l): float(s) / measured for l, s in table.meta["layer_wall_s"].items()}
    depth = np.array([args.layers - l for l in per_option], dtype=float)
    seconds = np.array(list(per_option.values()))
    slope, intercept = np.polyfit(depth, seconds, 1)
    projected = float(sum(measured * (slope * (args.layers - l) + intercept) for l in range(args.layers)))
    record.update({
        "options_measured_per_layer": measured, "options_per_pass": table.meta["options_per_pass"],
        "batched_per_option_s": {str(k): round(v, 5) for k, v in per_option.items()},
        "cost_model": {"per_layer_replayed_s": round(float(slope), 6), "per_option_fixed_s": round(float(intercept), 5)},
        "projected_exact_profile_s": round(projected, 1),
    })
    # the reference replays one option at a time with full logits: r(l) = (L - l) * layer_s + head_ref
    head_ref = max(record["reference_replay_from_layer0_s"] - args.layers * record["layer_s"], 0.0)
    record["reference_head_kl_s"] = round(head_ref, 5)
    record["projected_reference_profile_s"] = round(
        measured * (record["layer_s"] * args.layers * (args.layers + 1) / 2 + args.layers * head_ref), 1)
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    fisher = build_loss_table_fisher(adapter, ids, scores, channel_step=step, batch_size=1, progress=False)
    record["fisher_s"] = round(time.perf_counter() - start, 2)
    if device.type == "cuda":
        record["fisher_peak_mem_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    record["fisher_tokens"] = fisher.meta["tokens"]
    print(json.dumps(record), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps([record], indent=1) + "\n")


if __name__ == "__main__":
    main()
