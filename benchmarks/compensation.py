"""Choose the `lsq` ridge on validation data: GAP at 25% and 50%, compensation none / bias / lsq(ridge).

Same profile and Gram statistics as benchmarks/recovery.py; perplexity on the first `--windows`
windows of 128 tokens of the WikiText-2 and PTB *validation* splits, so that the choice does not
look at the test splits reported elsewhere.

    python benchmarks/compensation.py --data-dir ../shared/data --out docs/results/compensation.json
"""

from __future__ import annotations

from common import add_profile_flag, bench_config, calibrate_and_profile, evaluate_plan, parser
from result_log import ResultLog
from settings import DATASETS, SEQ_LEN, Window

from gapprune.api import load
from gapprune.pipeline import allocate, plan_from_allocation

VARIANTS = [("none", 0.0), ("bias", 0.0), ("lsq", 0.01), ("lsq", 0.1), ("lsq", 1.0), ("lsq", 10.0)]


def main() -> None:
    p = parser(__doc__, "docs/results/compensation.json")
    add_profile_flag(p)
    p.add_argument("--windows", type=int, default=64)
    args = p.parse_args()
    log = ResultLog(args.out)
    model, tokenizer = load(args.model)
    config = bench_config(args.data_dir, compensate="lsq")  # lsq: the calibration collects Gram statistics
    calibration, profile, _ = calibrate_and_profile(model, tokenizer, config, args.profile)
    windows = [Window(dataset, SEQ_LEN, args.windows, "validation") for dataset in DATASETS]
    for ratio in (0.25, 0.5):
        plan = plan_from_allocation(calibration.adapter, profile, allocate(profile, ratio, "gap"), {"ratio": ratio})
        for method, ridge in VARIANTS:
            summary, results = evaluate_plan(model, tokenizer, plan, windows, args.data_dir, compensate=method,
                                             gram=calibration.gram, ridge=ridge, progress=False)
            for window, r in results:
                log.emit({"ratio": ratio, "method": method, "ridge": ridge, "dataset": window.dataset,
                          "split": window.split, "seq_len": window.seq_len, "windows": r.windows, "ppl": r.ppl,
                          "applied": summary.get("applied"), "kept_original": summary.get("kept_original")})


if __name__ == "__main__":
    main()
