"""Peak memory of greedy OBS scoring on one random layer of a given shape (the importance phase).

On a wide MLP the float32 n × n Gram halves, their damped copy and H⁻¹ are the largest matrices of a
run; in bf16 they set its peak, since they do not shrink with the weights. Each measurement runs in
a fresh process so that `ru_maxrss` (a high-water mark) sees only it.

    python benchmarks/obs_memory.py --width 8960 --out-features 1536 --tokens 4096 --out docs/results/performance.json
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

from common import machine


def measure(width: int, out_features: int, tokens: int, joined: bool, handed_over: bool = False) -> dict:
    """In this process: the two Gram halves of `tokens` random rows, then OBS's order over them.

    `joined`: the halves summed by the caller, as `obs` did before b15f1a9 (and as code of that time
    needs: run this script with PYTHONPATH pointing at its `src` to measure it). `handed_over`: the
    halves given up to OBS as the layer cache does since 2026-12-03 (summed in place, no copy)."""
    import torch

    from gapprune.importance.obs import CHANNEL_BLOCKS, obs_order

    g = torch.Generator().manual_seed(0)
    halves = []
    for _ in range(2):
        x = torch.randn(tokens // 2, width, generator=g) * torch.linspace(0.3, 3.0, width)
        halves.append(x.T @ x)
        del x
    weight = torch.randn(out_features, width, generator=g)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    if joined:
        gram = halves[0] + halves[1]
    elif handed_over:
        gram = lambda: [halves.pop(0), halves.pop(0)]  # OBS gets the only references
    else:
        gram = halves
    obs_order(weight, gram, 1, max(1, width // CHANNEL_BLOCKS))
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"working_set_mb": round(peak - before, 1), "gram_mb": round(width * width * 4 / 2**20, 1),
            "halves_held_mb": round(2 * width * width * 4 / 2**20, 1), "wall_s": round(seconds, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--width", type=int, default=8960, help="input width of the output projection (MLP intermediate)")
    p.add_argument("--out-features", type=int, default=1536, help="its output width (the hidden size)")
    p.add_argument("--tokens", type=int, default=4096, help="calibration tokens over both halves")
    p.add_argument("--joined", action="store_true", help="pass the summed halves (the caller's form before b15f1a9)")
    p.add_argument("--handed-over", action="store_true", help="hand the halves over (the layer cache's form since 2026-12-03)")
    p.add_argument("--note", default="", help="what code this measures, kept in the record")
    p.add_argument("--out", help="append the record to this JSON list")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(measure(args.width, args.out_features, args.tokens, args.joined, args.handed_over)))
        return
    command = [sys.executable, __file__, "--child", "--width", str(args.width), "--out-features",
               str(args.out_features), "--tokens", str(args.tokens)] + (["--joined"] if args.joined else []) \
        + (["--handed-over"] if args.handed_over else [])
    result = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    record = {"kind": "obs_memory", "width": args.width, "out_features": args.out_features, "tokens": args.tokens,
              "caller_sums_halves": args.joined, "halves_handed_over": args.handed_over, **result, "code": args.note, "date": date.today().isoformat(),
              "machine": machine(),
              "command": "python benchmarks/obs_memory.py " + " ".join(sys.argv[1:])}
    print(json.dumps(record, indent=1))
    if args.out:
        path = Path(args.out)
        records = json.loads(path.read_text()) if path.exists() else []
        path.write_text(json.dumps(records + [record], indent=1) + "\n")


if __name__ == "__main__":
    main()
