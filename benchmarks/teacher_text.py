"""Teacher-written training text for distillation: generate it once into the cache and time it.

The distillation runs then find it cached (`gapprune.tune.teacher_text`), so their tuning time is
training only; this record says what the text cost to write, for a fair comparison with
ready-made text (Alpaca).

    python benchmarks/teacher_text.py --windows 1024 --threads 2 --out docs/results/recovery.json
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultLog, parser

SYMBOLS, SYMBOL_HEAVY = "{}();=<>[]_#/\\|*", 0.03  # a crude test for code and markup among the sequences


def symbol_share(text: str) -> float:
    return sum(text.count(c) for c in SYMBOLS) / max(len(text), 1)


def main() -> None:
    p = parser(__doc__, out="docs/results/recovery.json")
    p.add_argument("--windows", type=int, default=1024, help="windows of 128 tokens (the distillation's --self-windows)")
    p.add_argument("--self-len", type=int, default=512, help="tokens per written sequence")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cache-dir", default=None, help="default: the distillation's cache")
    p.add_argument("--samples", type=int, default=3, help="windows decoded into the record, to read what it writes")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from gapprune.data import bos_token_id
    from gapprune.models.loading import default_cache_dir
    from gapprune.tune.teacher import load_teacher
    from gapprune.tune.teacher_text import training_windows

    teacher, tokenizer = load_teacher(args.model)
    cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir() / "teacher_text"
    before = set(cache.rglob("part_*.pt")) if cache.exists() else set()  # paths: every setting has its folder
    start = time.perf_counter()
    windows, _ = training_windows("self", tokenizer, 128, teacher=teacher, teacher_id=args.model,
                                  self_windows=args.windows, self_len=args.self_len, cache_dir=cache, seed=0)
    seconds = time.perf_counter() - start
    fresh = len(set(cache.rglob("part_*.pt")) - before)
    bos = int(bos_token_id(tokenizer) is not None)  # windows start with BOS when the model takes one
    per_sequence = max(1, args.self_len // (128 - bos))
    sequences = [tokenizer.decode(s) for s in windows.view(-1, per_sequence, 128)[:, :, bos:].flatten(1)]
    ResultLog(args.out).emit({
        "kind": "teacher_text", "model": args.model, "windows": int(windows.shape[0]), "seq_len": 128,
        "tokens": int(windows.numel()), "self_len": args.self_len, "threads": args.threads, "gen_s": round(seconds, 1),
        "batches_written": fresh, **({"note": "all read from the cache: gen_s is not a generation time"} if not fresh else {}),
        "sequences": len(sequences), "symbol_heavy_sequences": sum(symbol_share(t) > SYMBOL_HEAVY for t in sequences),
        "symbol_heavy": f"over {SYMBOL_HEAVY:.0%} of the characters in {SYMBOLS} (code, markup)",
        "samples": [tokenizer.decode(w[:64]) for w in windows[: args.samples]],
    })


if __name__ == "__main__":
    main()
