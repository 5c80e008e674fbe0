"""Transient memory of the profilers' head-space metric by logits chunk, on a random head.

Each chunk size runs in its own process (peak RSS is per process): the dense reference and one
replay's metric on `--rows` positions, `chunk_rows` 512 (the old default) against 0 (the default:
`LOGIT_CHUNK_ELEMENTS` logits per chunk whatever the vocabulary). Reports the peak RSS above the
head and inputs, and checks that both give the same sum.

    python benchmarks/logit_chunk.py --vocab 151936 --hidden 1536 --out docs/results/performance.json
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


def measure(vocab: int, hidden: int, rows: int, chunk_rows: int) -> dict[str, float]:
    """Runs in a child process: the metric's peak RSS above its inputs, and its value."""
    import torch

    from gapprune.profiling.head import make_head_reference, metric_sums, rows_per_chunk

    torch.set_num_threads(1)
    torch.manual_seed(0)
    norm, head = torch.nn.LayerNorm(hidden), torch.nn.Linear(hidden, vocab, bias=False)
    dense, replay = torch.randn(1, rows, hidden), torch.randn(1, rows, hidden)
    ids = torch.randint(0, vocab, (1, rows))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    with torch.inference_mode():
        reference = make_head_reference(norm, head, [dense], [ids], "kl", torch.device("cpu"), chunk_rows=chunk_rows)
        value = float(metric_sums(norm, head, replay, 0, reference, copies=1, chunk_rows=chunk_rows)[0])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"rows_per_chunk": rows_per_chunk(chunk_rows, vocab), "transient_mb": round(peak - base, 1), "value": value}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=151_936)
    p.add_argument("--hidden", type=int, default=1536)
    p.add_argument("--rows", type=int, default=1024, help="positions (one profiling batch: 8 windows of 128)")
    p.add_argument("--out", default=None)
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.vocab, args.hidden, args.rows, args.child)))
        return
    results = {}
    for chunk in (512, 0):
        out = subprocess.run([sys.executable, __file__, "--vocab", str(args.vocab), "--hidden", str(args.hidden),
                              "--rows", str(args.rows), "--child", str(chunk)], check=True, capture_output=True, text=True)
        results[chunk] = json.loads(out.stdout.strip().splitlines()[-1])
    if abs(results[0]["value"] - results[512]["value"]) > 1e-4 * abs(results[512]["value"]):
        raise SystemExit(f"the chunk changed the metric: {results}")
    record = {"kind": "logit_chunk", "vocab": args.vocab, "hidden": args.hidden, "rows": args.rows,
              "transient_mb_chunk_512": results[512]["transient_mb"], "transient_mb_default": results[0]["transient_mb"],
              "rows_per_chunk_default": results[0]["rows_per_chunk"]}
    if args.out:
        ResultLog(args.out).emit(record)
    else:
        print(json.dumps(record))


if __name__ == "__main__":
    main()
