"""Measured per-layer cost of exact ΔL profiling, for projecting a 7B-model profile.

Builds one randomly initialised decoder layer, the final norm and the LM head of a model shape
(default: Llama-2-7B: hidden 4096, 32 heads, MLP 11008, vocab 32000) and times, on the device given:
one layer forward on `tokens` calibration tokens, and the head + KL metric on the same tokens.
An exact profile replays on average L/2 layers plus the head per option, for L x K options, so

    profile_s ≈ L · K · (L/2 · layer_s + head_s)

    python benchmarks/layer_cost.py --device cuda --dtype bfloat16 --out docs/results/layer_cost.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from gapprune.profiling.metrics import DenseReference, kl_metric


def timed(fn, device: torch.device, repeats: int = 10) -> float:  # type: ignore[no-untyped-def]
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tokens", type=int, default=2048, help="calibration tokens per replay (batch x seq)")
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=32)
    parser.add_argument("--intermediate", type=int, default=11008)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--options", type=int, default=66, help="options per layer (attn + MLP)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    config = LlamaConfig(hidden_size=args.hidden, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                         intermediate_size=args.intermediate, vocab_size=args.vocab, num_hidden_layers=1,
                         max_position_embeddings=max(4096, args.seq_len))
    config._attn_implementation = "sdpa"
    layer = LlamaDecoderLayer(config, 0).to(device, dtype).eval()
    norm = LlamaRMSNorm(args.hidden).to(device, dtype)
    head = torch.nn.Linear(args.hidden, args.vocab, bias=False).to(device, dtype)
    rotary = LlamaRotaryEmbedding(config).to(device)
    batch = max(1, args.tokens // args.seq_len)
    hidden = torch.randn(batch, args.seq_len, args.hidden, device=device, dtype=dtype)
    positions = torch.arange(args.seq_len, device=device).unsqueeze(0).expand(batch, -1)
    cos_sin = rotary(hidden, positions)
    layer_s = timed(lambda: layer(hidden, position_embeddings=cos_sin, attention_mask=None), device)
    probs = torch.softmax(torch.randn(batch, args.seq_len, args.vocab, device=device), -1)
    reference = DenseReference([probs], [(probs * probs.log()).sum(-1)], [])
    head_s = timed(lambda: kl_metric(head(norm(hidden)).float(), 0, reference), device)
    per_option = args.layers / 2 * layer_s + head_s
    record = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": args.dtype, "tokens": batch * args.seq_len, "hidden": args.hidden, "intermediate": args.intermediate,
        "vocab": args.vocab, "layer_s": round(layer_s, 6), "head_kl_s": round(head_s, 6),
        "layers": args.layers, "options_per_layer": args.options,
        "projected_exact_profile_s": round(args.layers * args.options * per_option, 1),
        "torch": torch.__version__,
    }
    print(json.dumps(record))
    if args.out:
        path = Path(args.out)
        records = json.loads(path.read_text()) if path.exists() else []
        path.write_text(json.dumps(records + [record], indent=1) + "\n")


if __name__ == "__main__":
    main()
