"""Dense perplexity of a model on the full WikiText-2 and PTB test splits at seq-len 128 and 2048.

    python benchmarks/dense_ppl.py --model smollm2-135m --data-dir ../shared/data --out docs/results/dense.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import date
from pathlib import Path

import torch

from gapprune.data import consecutive_windows, load_text, tokenize_text
from gapprune.evaluate.perplexity import perplexity
from gapprune.models.loading import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", default="docs/results/dense.json")
    parser.add_argument("--datasets", default="wikitext2,ptb")
    parser.add_argument("--seq-lens", default="128,2048")
    args = parser.parse_args()

    model, tokenizer = load_model(args.model)
    machine = f"{platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    records = []
    for dataset in args.datasets.split(","):
        ids = tokenize_text(load_text(dataset, "test", args.data_dir), tokenizer)
        for seq_len in map(int, args.seq_lens.split(",")):
            windows = consecutive_windows(ids, seq_len)
            batch = max(1, 2048 // seq_len)
            result = perplexity(model, windows, batch_size=batch, dataset=dataset, split="test", text_tokens=ids.numel())
            record = {"model": args.model, **result.to_record(), "date": str(date.today()), "machine": machine}
            print(json.dumps(record), flush=True)
            records.append(record)
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"total wall {time.perf_counter() - t0:.0f} s")
