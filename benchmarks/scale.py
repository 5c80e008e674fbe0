"""Peak memory and wall time of pruning in memory vs with the decoder layers streamed from disk, and
of profiling with 1 vs N torchrun ranks; records for docs/results/scale.json.

Each measured run is a fresh process (`one` below) that calls the `gapprune` CLI in-process and reads its
own peak resident memory (`resource.getrusage`, ru_maxrss: the high-water mark of the whole process,
model loading included); under torchrun every rank reports its own and the record keeps the largest.

    # a random Llama-shaped model written shard by shard (one decoder layer per shard), never whole in memory
    python benchmarks/scale.py make --out runs/scale/llama-8g --layers 9 --hidden 4096 --heads 16 \
        --kv-heads 4 --intermediate 14336 --vocab 32000 --tie
    # one measured run: in memory (--offload off) or streamed (--offload on); --nproc N: torchrun with N ranks
    python benchmarks/scale.py run --label streamed --model runs/scale/llama-8g --nproc 1 --record docs/results/scale.json \
        --reference-table runs/scale/ref/loss_table.json -- --ratio 0.2 --offload on --out runs/scale/out ...

The GPU projection (docs/performance.md §5) with streaming and two or more ranks: `benchmarks/scale_gpu.sh`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch
from common import ResultLog


def make_model(args: argparse.Namespace) -> None:
    """config.json, a small byte-level BPE tokenizer and one safetensors shard per layer, written one at a time."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    from gapprune.models.streaming import INDEX_FILE, write_safetensors

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(hidden_size=args.hidden, intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                         num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                         head_dim=args.hidden // args.heads, vocab_size=args.vocab, tie_word_embeddings=args.tie,
                         max_position_embeddings=4096)
    config.architectures = ["LlamaForCausalLM"]
    config.dtype = args.dtype  # what `--dtype auto` reads on a GPU
    config.save_pretrained(out)
    text = Path(args.text).read_text()[:200_000] if args.text else "the quick brown fox jumps over the lazy dog. " * 200
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator([text], trainers.BpeTrainer(vocab_size=min(1000, args.vocab),
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        special_tokens=["<eos>"]))
    PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>").save_pretrained(out)
    gen = torch.Generator(args.device).manual_seed(0)  # cuda: a 7B model's 15 GB drawn in seconds, not minutes
    h, i, d = args.hidden, args.intermediate, args.hidden // args.heads
    std = 0.02
    dtype = getattr(torch, args.dtype)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen, device=args.device) * std).to(dtype).cpu()

    n = args.layers + 1
    names = [f"model-{k + 1:05d}-of-{n:05d}.safetensors" for k in range(n)]
    weight_map: dict[str, str] = {}
    total = 0
    for layer in range(args.layers):
        p = f"model.layers.{layer}."
        tensors = {
            p + "self_attn.q_proj.weight": rand(args.heads * d, h), p + "self_attn.k_proj.weight": rand(args.kv_heads * d, h),
            p + "self_attn.v_proj.weight": rand(args.kv_heads * d, h), p + "self_attn.o_proj.weight": rand(h, args.heads * d),
            p + "mlp.gate_proj.weight": rand(i, h), p + "mlp.up_proj.weight": rand(i, h), p + "mlp.down_proj.weight": rand(h, i),
            p + "input_layernorm.weight": torch.ones(h, dtype=dtype),
            p + "post_attention_layernorm.weight": torch.ones(h, dtype=dtype),
        }
        total += write_safetensors(out / names[layer], tensors)
        weight_map.update(dict.fromkeys(tensors, names[layer]))
        del tensors
        print(f"layer {layer} written", flush=True)
    rest = {"model.embed_tokens.weight": rand(args.vocab, h), "model.norm.weight": torch.ones(h, dtype=dtype)}
    if not args.tie:
        rest["lm_head.weight"] = rand(args.vocab, h)
    total += write_safetensors(out / names[-1], rest)
    weight_map.update(dict.fromkeys(rest, names[-1]))
    (out / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
    print(f"wrote {total / 1e9:.2f} GB of weights to {out}")


def one(args: argparse.Namespace, cli_args: list[str]) -> None:
    """A measured CLI run in this process: prints one RESULT line with wall time and peak RSS."""
    from gapprune.cli import main

    start = time.perf_counter()
    code = main(cli_args)
    wall = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    print("RESULT " + json.dumps({"rank": int(os.environ.get("RANK", "0")), "code": code, "wall_s": round(wall, 2),
                                  "peak_rss_mb": round(peak_mb, 1)}), flush=True)
    sys.exit(code)


def max_rel_diff(table: Path, reference: Path) -> float:
    a, b = (json.loads(p.read_text())["loss"] for p in (table, reference))
    diff = max(float(abs(x - y)) for c in a for ra, rb in zip(a[c], b[c]) for x, y in zip(ra, rb))
    scale = max(float(abs(y)) for c in b for rb in b[c] for y in rb)
    return diff / scale if scale else diff


def weights_mb(model: str) -> float:
    from gapprune.models.loading import resolve_model_source
    from gapprune.models.streaming import weights_bytes

    return round(weights_bytes(resolve_model_source(model)) / 2**20, 1)


def run(args: argparse.Namespace, cli_args: list[str]) -> None:
    """Launch `one` (plainly or under torchrun), collect the ranks' RESULT lines, append a record."""
    argv = ["prune", args.model, *cli_args]
    here = str(Path(__file__).resolve())
    if args.nproc > 1:
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.nproc)]
    else:
        launch = [sys.executable]
    load = os.getloadavg()
    done = subprocess.run([*launch, here, "one", "--", *argv], capture_output=True, text=True, check=False)
    results = [json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not results:
        sys.exit(f"run failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    out = Path(cli_args[cli_args.index("--out") + 1])
    record = {
        "model": args.name or args.model, "mode": args.label, "world_size": args.nproc,
        "weights_mb": weights_mb(args.model), "peak_rss_mb": max(r["peak_rss_mb"] for r in results),
        "wall_s": max(r["wall_s"] for r in results),
        "compensate": cli_args[cli_args.index("--compensate") + 1] if "--compensate" in cli_args else "lsq",
        "peak_rss_over_weights": round(max(r["peak_rss_mb"] for r in results) / weights_mb(args.model), 3),
        "table_max_rel_diff": (max_rel_diff(out / "loss_table.json", Path(args.reference_table))
                               if args.reference_table else None),
        "table_reference": args.reference_table,
        "rank_peak_rss_mb": [r["peak_rss_mb"] for r in sorted(results, key=lambda r: r["rank"])],
        "omp_threads_per_rank": os.environ.get("OMP_NUM_THREADS"),
        "load_avg_1m_start": round(load[0], 2), "load_avg_1m_end": round(os.getloadavg()[0], 2),
        "peak_rss_mb_after": run_phases(out).get("peak_rss_mb_after"),  # rank 0's running peak after each phase
        "cli": " ".join(["gapprune", *argv]),
    }
    if args.record:
        ResultLog(args.record).emit(record)  # adds date, machine and this script's command
    else:
        print(json.dumps(record))


def run_phases(out: Path) -> dict:
    """The pruned folder's run.json (phase times and peaks), empty when the run wrote none."""
    path = out / "run.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def main() -> None:
    argv = sys.argv[1:]
    cli_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make", help="write a random Llama-shaped safetensors model, one layer at a time")
    m.add_argument("--out", required=True)
    m.add_argument("--layers", type=int, default=9)
    m.add_argument("--hidden", type=int, default=4096)
    m.add_argument("--heads", type=int, default=16)
    m.add_argument("--kv-heads", type=int, default=4)
    m.add_argument("--intermediate", type=int, default=14336)
    m.add_argument("--vocab", type=int, default=32000)
    m.add_argument("--tie", action="store_true", help="tie the LM head to the embedding")
    m.add_argument("--text", default=None, help="text to train the small tokenizer on")
    m.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="the weights' dtype")
    m.add_argument("--device", default="cpu", help="where the random weights are drawn (cuda is fastest)")
    sub.add_parser("one", help="(internal) one measured run of `gapprune ARGS...` in this process")
    r = sub.add_parser("run", help="measure `gapprune prune MODEL ARGS...` (after --) and append a record")
    r.add_argument("--model", required=True)
    r.add_argument("--name", default=None, help="model name in the record (default: --model)")
    r.add_argument("--label", required=True, help="the record's mode, e.g. in-memory, streamed")
    r.add_argument("--nproc", type=int, default=1, help="torchrun ranks (1: a plain process)")
    r.add_argument("--record", default=None, help="append the record to this JSON list")
    r.add_argument("--reference-table", default=None, help="loss_table.json to compare the run's table with")
    args = parser.parse_args(argv)
    if args.command == "make":
        make_model(args)
    elif args.command == "one":
        one(args, cli_args)
    else:
        run(args, cli_args)


if __name__ == "__main__":
    main()
