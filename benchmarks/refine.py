"""Does `--refine` help? GAP at a ratio, with and without re-profiling around the plan.

Reuses the allocator benchmark's loss table (same calibration), runs N refinement rounds, and
reports each round's true loss (all components pruned together, KL on the profiling tokens) and
the WikiText-2 perplexity (first 256 windows of 128) of the plain and the refined plan.

    python benchmarks/refine.py --data-dir ../shared/data --ratio 0.25 --rounds 1 --out docs/results/refine.json
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from datetime import date
from pathlib import Path

from gapprune.api import evaluate_ppl, load
from gapprune.config import PruneConfig
from gapprune.pipeline import allocate, plan_from_allocation, profile_model, prune_model_


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--table", default="runs/allocators_loss_table.json")
    parser.add_argument("--ratio", type=float, default=0.25)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", default="docs/results/refine.json")
    args = parser.parse_args()
    model, tokenizer = load(args.model)
    config = PruneConfig(ratio=args.ratio, calib_samples=32, profile_samples=4, seq_len=128, batch_size=4, mlp_stride=4,
                         data_dir=args.data_dir, compensate="none",
                         loss_table=args.table if Path(args.table).exists() else None)
    profile = profile_model(model, tokenizer, config)
    start = time.perf_counter()
    plain = allocate(profile, args.ratio, "gap")
    refined = allocate(profile, args.ratio, "gap", refine_rounds=args.rounds, mlp_stride=config.mlp_stride)
    refine_s = time.perf_counter() - start
    records = []
    for name, allocation in (("gap", plain), ("gap+refine", refined)):
        pruned = copy.deepcopy(model)
        prune_model_(pruned, plan_from_allocation(profile, allocation, config.to_dict()))
        result = evaluate_ppl(pruned, tokenizer, "wikitext2", seq_len=128, max_windows=256, data_dir=args.data_dir)
        records.append({"plan": name, "target_ratio": args.ratio, "achieved_ratio": allocation.removed_params(profile.table)
                        / profile.total_params, "dataset": "wikitext2", "seq_len": 128, "windows": result.windows,
                        "ppl": result.ppl, "date": str(date.today())})
    records.append({"refine_history": refined.info["refine_history"], "refine_helped": refined.info["refine_helped"],
                    "rounds": args.rounds, "refine_wall_s": round(refine_s, 1)})
    print(json.dumps(records, indent=1))
    Path(args.out).write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    main()
