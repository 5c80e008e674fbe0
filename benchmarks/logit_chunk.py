"""Transient memory and time of the profilers' head-space metric by logits chunk, on a random head.

Each chunk size runs in its own process (peak RSS is per process): the dense reference and one
replay's metric on `--rows` positions, for each `chunk_rows` of `--chunks` (default 512, the old
fixed chunk, against 0, the default tiles of `LOGIT_CHUNK_ELEMENTS` logits). Reports the peak RSS
above the head and inputs, the seconds of one replay's metric (warm: the second of two calls), and
checks that all give the same sum. `--chunks 110,0` compares the row chunks over the whole vocabulary
that were the default for a 151,936-token head until 2026-12-04 (110 rows x 151,936 fit 2^24 logits,
so the tile spans the vocabulary, as before) with today's tiles of many rows and a vocabulary slice.

    python benchmarks/logit_chunk.py --vocab 151936 --hidden 1536 --threads 2 --chunks 110,0 --out docs/results/performance.json
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultLog


def measure(vocab: int, hidden: int, rows: int, chunk_rows: int, threads: int) -> dict[str, float]:
    """Runs in a child process: the metric's peak RSS above its inputs, its warm time and its value."""
    import time

    import torch

    from gapprune.engine.head import make_head_reference, metric_sums, rows_per_chunk

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    norm, head = torch.nn.LayerNorm(hidden), torch.nn.Linear(hidden, vocab, bias=False)
    dense, replay = torch.randn(1, rows, hidden), torch.randn(1, rows, hidden)
    ids = torch.randint(0, vocab, (1, rows))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with torch.inference_mode():
        reference = make_head_reference(norm, head, [dense], [ids], "kl", torch.device("cpu"), chunk_rows=chunk_rows)
        value = float(metric_sums(norm, head, replay, 0, reference, copies=1, chunk_rows=chunk_rows)[0])
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        start = time.perf_counter()  # the first call paged the head in; a replay in a run finds it warm
        metric_sums(norm, head, replay, 0, reference, copies=1, chunk_rows=chunk_rows)
        seconds = time.perf_counter() - start
    return {"rows_per_chunk": rows_per_chunk(chunk_rows, vocab), "transient_mb": round(peak - base, 1),
            "value": value, "replay_s": round(seconds, 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=151_936)
    p.add_argument("--hidden", type=int, default=1536)
    p.add_argument("--rows", type=int, default=1024, help="positions (one profiling batch: 8 windows of 128)")
    p.add_argument("--chunks", default="512,0", help="chunk_rows settings to compare, comma-separated (0: the default)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None)
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.vocab, args.hidden, args.rows, args.child, args.threads)))
        return
    results = {}
    for chunk in (int(c) for c in args.chunks.split(",")):
        out = subprocess.run([sys.executable, __file__, "--vocab", str(args.vocab), "--hidden", str(args.hidden),
                              "--rows", str(args.rows), "--threads", str(args.threads), "--child", str(chunk)],
                             check=True, capture_output=True, text=True)
        results[chunk] = json.loads(out.stdout.strip().splitlines()[-1])
    first = next(iter(results.values()))["value"]
    if any(abs(r["value"] - first) > 1e-4 * abs(first) for r in results.values()):
        raise SystemExit(f"the chunk changed the metric: {results}")
    record = {"kind": "logit_chunk", "vocab": args.vocab, "hidden": args.hidden, "rows": args.rows,
              "threads": args.threads,
              **{f"transient_mb_chunk_{c or 'default'}": r["transient_mb"] for c, r in results.items()},
              **{f"replay_s_chunk_{c or 'default'}": r["replay_s"] for c, r in results.items()},
              "rows_per_chunk_default": results[0]["rows_per_chunk"] if 0 in results else None}
    if args.out:
        ResultLog(args.out).emit(record)
    else:
        print(json.dumps(record))


if __name__ == "__main__":
    main()
