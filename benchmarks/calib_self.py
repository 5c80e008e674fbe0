"""Data-free calibration: GAP at 25% calibrated on self-generated text vs on WikiText-2.

SmolLM2-135M, the benchmark calibration sizes (`settings.CALIBRATION`: 32 windows x 128 tokens,
the first 4 for ΔL) with the product's defaults otherwise (auto profiler, obs, sequential lsq);
only `calib` differs: `wikitext2` (validation split) or `self` (sampled from the model, seeded).
Perplexity on the first 256 windows of 128 tokens of the WikiText-2 and PTB test splits. Records
in recovery.json with `kind` "calib". Resumable.

    python benchmarks/calib_self.py --data-dir ../shared/data --out docs/results/recovery.json
"""

from __future__ import annotations

import time

from common import bench_config, parser, perplexities
from result_log import ResultLog
from settings import DATASETS, Window

from gapprune.api import load, prune


def main() -> None:
    p = parser(__doc__, "docs/results/recovery.json")
    p.add_argument("--ratio", type=float, default=0.25)
    p.add_argument("--calibs", default="self,wikitext2")
    p.add_argument("--windows", type=int, default=256)
    args = p.parse_args()
    log = ResultLog(args.out)
    done = {(r.get("calib"), r.get("ratio"), r.get("dataset")) for r in log.records if r.get("kind") == "calib"}
    for calib in args.calibs.split(","):
        windows = [Window(d, windows=args.windows) for d in DATASETS if (calib, args.ratio, d) not in done]
        if not windows:
            continue
        model, tokenizer = load(args.model)
        config = bench_config(args.data_dir, ratio=args.ratio, calib=calib, criterion="obs", compensate="lsq",
                              profiler="auto")
        start = time.perf_counter()
        plan, profile = prune(model, tokenizer, config)
        prune_s = round(time.perf_counter() - start, 1)
        timings = {k: round(v, 1) for k, v in (profile.timings if profile else {}).items()}
        for window, result in perplexities(model, tokenizer, windows, args.data_dir):
            log.emit({"kind": "calib", "calib": calib, "ratio": args.ratio, "dataset": window.dataset,
                      "seq_len": window.seq_len, "windows": window.windows, "ppl": round(result.ppl, 3),
                      "criterion": "obs", "compensate": "lsq", "sequential": True, "profiler": "auto",
                      "achieved_ratio": plan.summary["achieved_ratio"], "prune_s": prune_s, "timings": timings})


if __name__ == "__main__":
    main()
