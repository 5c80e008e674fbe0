"""Does `--refine` help? GAP at a ratio, with and without re-profiling around the plan.

Reuses the shared benchmark profile (same calibration), runs N refinement rounds, and reports each
round's true loss (all components pruned together, KL on the profiling tokens) and the WikiText-2
perplexity (first 256 windows of 128) of the plain and the refined plan.

    python benchmarks/refine.py --data-dir ../shared/data --ratio 0.25 --rounds 1 --out docs/results/refine.json
"""

from __future__ import annotations

import json
import time
from datetime import date
from pathlib import Path

from common import add_profile_flag, bench_config, calibrate_and_profile, evaluate_plan, parser
from settings import Window

from gapprune.api import load
from gapprune.pipeline import allocate, plan_from_allocation, refine_allocation


def main() -> None:
    p = parser(__doc__, "docs/results/refine.json")
    add_profile_flag(p)
    p.add_argument("--ratio", type=float, default=0.25)
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args()
    model, tokenizer = load(args.model)
    config = bench_config(args.data_dir, ratio=args.ratio)
    calibration, profile, _ = calibrate_and_profile(model, tokenizer, config, args.profile)
    start = time.perf_counter()
    plain = allocate(profile, args.ratio, "gap")
    refined = refine_allocation(calibration, profile, plain, args.ratio, args.rounds, config.mlp_stride)
    refine_s = time.perf_counter() - start
    records = []
    for name, allocation in (("gap", plain), ("gap+refine", refined)):
        plan = plan_from_allocation(calibration.adapter, profile, allocation, config.to_dict())
        _, [(_, result)] = evaluate_plan(model, tokenizer, plan, [Window("wikitext2")], args.data_dir)
        records.append({"plan": name, "target_ratio": args.ratio, "achieved_ratio": allocation.removed_params(profile.table)
                        / profile.total_params, "dataset": "wikitext2", "seq_len": result.seq_len,
                        "windows": result.windows, "ppl": result.ppl, "date": str(date.today())})
    records.append({"refine_history": refined.info["refine_history"], "refine_helped": refined.info["refine_helped"],
                    "rounds": args.rounds, "refine_wall_s": round(refine_s, 1)})
    print(json.dumps(records, indent=1))
    Path(args.out).write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    main()
