"""SmolLM2-135M dense vs GAP-pruned, exported to GGUF and run in llama.cpp (cyllama): perplexity and speed.

    python benchmarks/llamacpp.py --phase ppl   --data-dir ../shared/data
    python benchmarks/llamacpp.py --phase speed --rounds 3
    # another model's pruned folder alone, f16, 64 windows:
    python benchmarks/llamacpp.py --phase ppl --models qwen2.5-coder-1.5b=runs/q15-gap-25 --ratios 0.25 \
        --ratio-of decoder --types f16 --windows 64 --data-dir ../shared/data

Perplexity: WikiText-2 test, first 256 windows of 128 tokens (no BOS), the same token windows for
llama.cpp and transformers (tokenised once by the transformers tokenizer; the GGUF's tokenizer gives
the same ids, tested). Speed: llama-bench style pp512 and tg128 at batch 1 with `--threads` threads;
`--rounds` interleaved rounds over all models, medians of all runs; the 1-minute load average is
recorded before every measurement because this machine is shared. Records are merged into `--out`
keyed by (model, type), so the phases can run separately and be resumed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from datetime import date
from pathlib import Path
from typing import Any

# Run as a script, this file's folder is sys.path[0] and this file would shadow the gguf package.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

RUNTIME = "llama.cpp b9190 via cyllama 0.2.18"


def load_records(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    if not path.exists():
        return {}
    return {(r["model"], r["type"]): r for r in json.loads(path.read_text())}


def save_records(path: Path, records: dict[tuple[str, str], dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(list(records.values()), indent=1) + "\n")


def meta() -> dict[str, Any]:
    return {"date": str(date.today()), "machine": f"{platform.machine()} CPU, {os.cpu_count()} cores",
            "command": "python " + " ".join(sys.argv)}


def gguf_path(work: Path, name: str, file_type: str) -> Path:
    return work / f"{name}-{file_type}.gguf"


def export_all(models: dict[str, str], types: list[str], work: Path) -> None:
    """Export every (model, type) GGUF that is not there yet."""
    from gapprune.api import load
    from gapprune.export.gguf import export_gguf, record_gguf_source

    for name, spec in models.items():
        missing = [t for t in types if not gguf_path(work, name, t).exists()]
        if not missing:
            continue
        model, tokenizer = load(spec)
        record_gguf_source(model, spec)
        for file_type in missing:
            result = export_gguf(model, tokenizer, gguf_path(work, name, file_type), file_type=file_type)
            print(json.dumps(result.to_record()), flush=True)


def phase_ppl(args: argparse.Namespace, models: dict[str, str], ratios: dict[str, float]) -> None:
    from gapprune.api import load
    from gapprune.data import consecutive_windows, load_text, tokenize_text
    from gapprune.evaluate.llamacpp import gguf_perplexity
    from gapprune.evaluate.perplexity import perplexity

    types = args.types.split(",")
    work, out = Path(args.work), Path(args.out)
    export_all(models, types, work)
    records = load_records(out)
    text = load_text("wikitext2", "test", args.data_dir)
    for name, spec in models.items():
        model, tokenizer = load(spec)
        ids = tokenize_text(text, tokenizer)
        windows = consecutive_windows(ids, args.seq_len, args.windows)
        reference = perplexity(model, windows, batch_size=8, dataset="wikitext2", split="test",
                               text_tokens=ids.numel(), progress=False)
        del model
        for file_type in types:
            path = gguf_path(work, name, file_type)
            result = gguf_perplexity(path, windows, threads=args.ppl_threads, dataset="wikitext2", split="test")
            record = records.get((name, file_type), {"model": name, "type": file_type})
            record.update(ratio=ratios[name], ratio_of=args.ratio_of, runtime=RUNTIME, ppl=round(result.ppl, 3),
                          ppl_transformers=round(reference.ppl, 3),
                          ppl_rel_diff=round(result.ppl / reference.ppl - 1, 5), windows=result.windows,
                          ppl_wall_s=result.wall_s, ppl_transformers_wall_s=reference.wall_s,
                          seq_len=result.seq_len, file_mb=round(path.stat().st_size / 2**20, 2), **meta())
            records[(name, file_type)] = record
            save_records(out, records)
            print(json.dumps(record), flush=True)


def phase_speed(args: argparse.Namespace, models: dict[str, str], ratios: dict[str, float]) -> None:
    from gapprune.evaluate.llamacpp import gguf_speed

    types = args.speed_types.split(",")
    thread_counts = [int(t) for t in args.speed_threads.split(",")]
    work, out = Path(args.work), Path(args.out)
    export_all(models, types, work)
    runs: dict[tuple[str, str, int], dict[str, list[float]]] = {}
    for round_ in range(args.rounds):
        for threads in thread_counts:
            for file_type in types:
                for name in models:
                    load = os.getloadavg()[0]
                    speed = gguf_speed(gguf_path(work, name, file_type), threads=threads, repeats=args.repeats,
                                       seed=round_)
                    slot = runs.setdefault((name, file_type, threads), {"prefill": [], "decode": [], "load": []})
                    slot["prefill"] += speed.prefill_tokens_per_s_all
                    slot["decode"] += speed.decode_tokens_per_s_all
                    slot["load"].append(load)
                    print(f"round {round_} {name} {file_type} {threads} threads: pp {speed.prefill_tokens_per_s:.1f} "
                          f"tg {speed.decode_tokens_per_s:.1f} tok/s (load {load:.2f})", flush=True)
    records = load_records(out)
    dense = next(iter(models))  # the first model is the reference
    for (name, file_type, threads), slot in runs.items():
        record = records.get((name, file_type), {"model": name, "type": file_type})
        base = runs[(dense, file_type, threads)]
        size = gguf_path(work, name, file_type).stat().st_size
        decode, prefill = statistics.median(slot["decode"]), statistics.median(slot["prefill"])
        numbers = {
            "prefill_tokens_per_s": round(prefill, 1), "decode_tokens_per_s": round(decode, 1),
            "speedup": round(decode / statistics.median(base["decode"]), 3),
            "prefill_speedup": round(prefill / statistics.median(base["prefill"]), 3),
            "decode_tokens_per_s_range": [round(min(slot["decode"]), 1), round(max(slot["decode"]), 1)],
            "speed_runs": len(slot["decode"]), "load_avg_1min": [round(x, 2) for x in slot["load"]],
        }
        by_threads = record.setdefault("speed_by_threads", {})
        by_threads[str(threads)] = numbers
        if threads == args.threads:
            record.update(numbers)
        record.update(ratio=ratios[name], runtime=RUNTIME, threads=args.threads, prompt_tokens=512, new_tokens=128,
                      ideal_speedup=round(gguf_path(work, dense, file_type).stat().st_size / size, 3),
                      file_mb=round(size / 2**20, 2), **meta())
        records[(name, file_type)] = record
    save_records(out, records)


def render(out: Path) -> str:
    """The markdown table of `out`'s records (for docs/results.md)."""
    records = sorted(load_records(out).values(), key=lambda r: (r["ratio"], r["type"]))
    header = ("| model | removed | type | file MB | ppl llama.cpp | ppl transformers | diff | pp512 tok/s | tg128 tok/s "
              "| decode speedup | ideal | speedup / ideal |")
    lines = [header, "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        has_speed = "decode_tokens_per_s" in r
        speed = (f"{r['prefill_tokens_per_s']:.0f} | {r['decode_tokens_per_s']:.1f} | {r['speedup']:.2f}x | "
                 f"{r['ideal_speedup']:.2f}x | {r['speedup'] / r['ideal_speedup']:.2f}") if has_speed else " | ".join("–" * 5)
        ppl = f"{r['ppl']:.2f} | {r['ppl_transformers']:.2f} | {100 * r['ppl_rel_diff']:+.2f}%" if "ppl" in r else " | ".join("–" * 3)
        lines.append(f"| {r['model']} | {100 * r['ratio']:.0f}% | {r['type']} | {r['file_mb']:.1f} | {ppl} | {speed} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phase", choices=["ppl", "speed", "all", "render"], default="all")
    parser.add_argument("--models", default="dense=smollm2-135m,gap25=runs/gguf/gap25,gap50=runs/gguf/gap50",
                        help="name=model pairs; the first is the dense reference")
    parser.add_argument("--ratios", default="0,0.25,0.5")
    parser.add_argument("--ratio-of", default="model", help="what the ratios are fractions of (model or decoder), recorded")
    parser.add_argument("--types", default="f32,f16,q8_0,q4_0", help="types for perplexity")
    parser.add_argument("--speed-types", default="f16,q4_0")
    parser.add_argument("--windows", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2, help="the thread count the top-level speed fields use")
    parser.add_argument("--speed-threads", default="2,1", help="thread counts to time (1 resists a busy machine)")
    parser.add_argument("--ppl-threads", type=int, default=1,
                        help="llama.cpp threads for perplexity (results do not depend on it; on a shared machine "
                             "ggml's spinning thread barriers make 2 threads far slower than 1)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--work", default="runs/gguf", help="where the GGUF files go (not committed)")
    parser.add_argument("--out", default="docs/results/gguf.json")
    args = parser.parse_args()
    models = dict(pair.split("=", 1) for pair in args.models.split(","))
    ratios = dict(zip(models, map(float, args.ratios.split(","))))
    if args.phase == "render":
        print(render(Path(args.out)))
    if args.phase in ("ppl", "all"):
        phase_ppl(args, models, ratios)
    if args.phase in ("speed", "all"):
        phase_speed(args, models, ratios)


if __name__ == "__main__":
    main()
