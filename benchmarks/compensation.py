"""Choose the `lsq` ridge on validation data: GAP at 25% and 50%, compensation none / bias / lsq(ridge).

Same loss table and Gram statistics as benchmarks/recovery.py; perplexity on the first `--windows`
windows of 128 tokens of the WikiText-2 and PTB *validation* splits, so that the choice does not
look at the test splits reported elsewhere.

    python benchmarks/compensation.py --data-dir ../shared/data --out docs/results/compensation.json
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

from result_log import ResultLog

from gapprune.api import evaluate_ppl, load
from gapprune.config import PruneConfig
from gapprune.pipeline import allocate, plan_from_allocation, profile_model, prune_model_

VARIANTS = [("none", 0.0), ("bias", 0.0), ("lsq", 0.01), ("lsq", 0.1), ("lsq", 1.0), ("lsq", 10.0)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--table", default="runs/allocators_loss_table.json")
    parser.add_argument("--windows", type=int, default=64)
    parser.add_argument("--out", default="docs/results/compensation.json")
    args = parser.parse_args()
    log = ResultLog(args.out)
    model, tokenizer = load(args.model)
    table = Path(args.table)
    config = PruneConfig(
        ratio=0.25, criterion="activation", calib_samples=32, profile_samples=4, seq_len=128, batch_size=4,
        mlp_stride=4, data_dir=args.data_dir, compensate="lsq", loss_table=str(table) if table.exists() else None,
    )
    profile = profile_model(model, tokenizer, config)
    for ratio in (0.25, 0.5):
        plan = plan_from_allocation(profile, allocate(profile, ratio, "gap"), {"ratio": ratio})
        for method, ridge in VARIANTS:
            pruned = copy.deepcopy(model)
            summary = prune_model_(pruned, plan, method, profile.gram, ridge)
            for dataset in ("wikitext2", "ptb"):
                r = evaluate_ppl(pruned, tokenizer, dataset, split="validation", seq_len=128, max_windows=args.windows,
                                 data_dir=args.data_dir, progress=False)
                log.emit({"ratio": ratio, "method": method, "ridge": ridge, "dataset": dataset, "split": "validation",
                          "seq_len": 128, "windows": r.windows, "ppl": r.ppl, "applied": summary.get("applied"),
                          "kept_original": summary.get("kept_original")})


if __name__ == "__main__":
    main()
