"""Data-free calibration: GAP at 25% calibrated on self-generated text vs on WikiText-2.

SmolLM2-135M, the benchmark calibration sizes (`settings.CALIBRATION`: 32 windows x 128 tokens,
the first 4 for ΔL) with the product's defaults otherwise (auto profiler, obs, sequential lsq);
only `calib` differs: `wikitext2` (validation split) or `self` (sampled from the model, seeded).
With `--swap`, also the crossed runs that say which stage the text matters for: the plan (scores and
loss table) from one calibration text, the lsq compensation fitted on the other's.
Perplexity on the first 256 windows of 128 tokens of the WikiText-2 and PTB test splits. Records
in recovery.json with `kind` "calib" (`calib`: the plan's text, `fit`: the compensation's). Resumable.

    python benchmarks/calib_self.py --data-dir ../shared/data --out docs/results/recovery.json [--swap]
"""

from __future__ import annotations

import time

from common import bench_config, parser, perplexities
from result_log import ResultLog
from settings import DATASETS, Window

from gapprune.api import load, pruned_copy
from gapprune.pipeline import Calibration, allocate, calibrate, plan_from_allocation, profile_model
from gapprune.profiling.tables import complete_table
from gapprune.prune.plan import Plan


def main() -> None:
    p = parser(__doc__, "docs/results/recovery.json")
    p.add_argument("--ratio", type=float, default=0.25)
    p.add_argument("--calibs", default="self,wikitext2")
    p.add_argument("--windows", type=int, default=256)
    p.add_argument("--swap", action="store_true", help="also each plan compensated on the other calibration text")
    args = p.parse_args()
    log = ResultLog(args.out)
    done = {(r.get("calib"), r.get("fit", r.get("calib")), r.get("ratio"), r.get("dataset"))
            for r in log.records if r.get("kind") == "calib"}
    calibs = args.calibs.split(",")
    runs = [(c, c) for c in calibs] + ([(a, b) for a in calibs for b in calibs if a != b] if args.swap else [])
    model, tokenizer = load(args.model)
    calibrations: dict[str, Calibration] = {}
    plans: dict[str, tuple[Plan, float]] = {}

    def plan_for(calib: str) -> tuple[Plan, float]:
        if calib not in plans:
            config = bench_config(args.data_dir, ratio=args.ratio, calib=calib, criterion="obs", compensate="lsq",
                                  profiler="auto")
            start = time.perf_counter()
            calibration = calibrations.setdefault(calib, calibrate(model, tokenizer, config))
            profile = profile_model(calibration, config, complete=False)
            profile.table = complete_table(calibration, profile.table, config, profile.total_params)
            plan = plan_from_allocation(calibration.adapter, profile, allocate(profile, args.ratio, "gap"),
                                        config.to_dict())
            plans[calib] = (plan, round(time.perf_counter() - start, 1))
        return plans[calib]

    for calib, fit in runs:
        windows = [Window(d, windows=args.windows) for d in DATASETS if (calib, fit, args.ratio, d) not in done]
        if not windows:
            continue
        plan, plan_s = plan_for(calib)
        plan_for(fit)  # the fitting text's calibration (inputs and Grams)
        fitting = calibrations[fit]
        pruned, summary = pruned_copy(model, plan, "lsq", fitting.gram, bench_config(args.data_dir).ridge,
                                      fitting.inputs)
        for window, result in perplexities(pruned, tokenizer, windows, args.data_dir):
            log.emit({"kind": "calib", "calib": calib, "fit": fit, "ratio": args.ratio, "dataset": window.dataset,
                      "seq_len": window.seq_len, "windows": window.windows, "ppl": round(result.ppl, 3),
                      "criterion": "obs", "compensate": "lsq", "sequential": True, "profiler": "auto",
                      "achieved_ratio": plan.summary["achieved_ratio"], "plan_s": plan_s,
                      "calibration_timings": {k: round(v, 1) for k, v in calibrations[calib].timings.items()},
                      "compensation_s": summary["wall_s"]})
        del pruned


if __name__ == "__main__":
    main()
