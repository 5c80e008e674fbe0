"""Lower loss at the same size: compensation-aware table, OBS selection, sequential compensation.

SmolLM2-135M at 25% and 50%, GAP plans from the benchmark calibration (`settings.CALIBRATION`) and
the auto profiler, WikiText-2 and PTB perplexity on the first 256 windows of 128 tokens. One
calibration per criterion (activation, obs); per criterion and table kind (plain, compensation-
aware) one auto table, grown from 25% to 50%. Methods:

* none / lsq: the plain table, saved without / with lsq compensation (lsq is today's default);
* sequential: the plain table, lsq fitted layer by layer on the pruned model's own inputs;
* aware: the compensation-aware table (options replayed with lsq applied), saved with lsq;
* obs: units chosen by greedy structured OBS, plain table, lsq;
* combinations of the three.

    python benchmarks/compensation_methods.py --data-dir ../shared/data --out docs/results/recovery.json
"""

from __future__ import annotations

import time
from typing import Any

from common import bench_config, parser, perplexities
from result_log import ResultLog
from settings import CALIBRATION, Window

from gapprune.api import load, pruned_copy
from gapprune.pipeline import (
    Calibration,
    allocate,
    calibrate,
    plan_from_allocation,
    profile_model,
)
from gapprune.profiling.tables import complete_table

# method -> (criterion, compensation-aware table, compensate, sequential)
METHODS: dict[str, tuple[str, bool, str, bool]] = {
    "none": ("activation", False, "none", False),
    "lsq": ("activation", False, "lsq", False),
    "sequential": ("activation", False, "lsq", True),
    "aware": ("activation", True, "lsq", False),  # the table refits out of sample
    "obs": ("obs", False, "lsq", False),
    "obs+sequential": ("obs", False, "lsq", True),
    "aware+sequential": ("activation", True, "lsq", True),
    "obs+aware+sequential": ("obs", True, "lsq", True),
}


def main() -> None:
    p = parser(__doc__, "docs/results/recovery.json")
    p.add_argument("--ratios", default="0.25,0.5")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--windows", type=int, default=256)
    p.add_argument("--calib-samples", type=int, default=CALIBRATION["calib_samples"],
                   help="calibration windows for statistics, Grams and fitting (ΔL stays on the first 4)")
    args = p.parse_args()
    log = ResultLog(args.out)
    done = {(r.get("method"), r.get("ratio"), r.get("dataset"), r.get("calib_samples", CALIBRATION["calib_samples"]))
            for r in log.records if r.get("kind") == "methods"}
    windows = [Window("wikitext2", windows=args.windows), Window("ptb", windows=args.windows)]
    ratios = [float(r) for r in args.ratios.split(",")]
    methods = args.methods.split(",")
    model, tokenizer = load(args.model)
    calibrations: dict[str, Calibration] = {}
    tables: dict[tuple[str, bool], Any] = {}
    for ratio in ratios:
        for method in methods:
            criterion, aware, compensate, sequential = METHODS[method]
            if all((method, ratio, w.dataset, args.calib_samples) in done for w in windows):
                continue
            config = bench_config(args.data_dir, ratio=ratio, criterion=criterion, compensate="lsq",
                                  compensation_aware=aware, profiler="auto", calib_samples=args.calib_samples)
            if criterion not in calibrations:
                calibrations[criterion] = calibrate(model, tokenizer, config)
            calibration = calibrations[criterion]
            start = time.perf_counter()
            if (criterion, aware) not in tables:
                tables[(criterion, aware)] = profile_model(calibration, config, complete=False)
            profile = tables[(criterion, aware)]
            profile.table = complete_table(calibration, profile.table, config, profile.total_params)
            plan = plan_from_allocation(calibration.adapter, profile, allocate(profile, ratio, "gap"), config.to_dict())
            profile_s = time.perf_counter() - start
            pruned, summary = pruned_copy(model, plan, compensate, calibration.gram, config.ridge,
                                          calibration.inputs if sequential else None)
            for window, result in perplexities(pruned, tokenizer, windows, args.data_dir):
                log.emit({"kind": "methods", "method": method, "ratio": ratio, "dataset": window.dataset,
                          "seq_len": window.seq_len, "windows": window.windows, "ppl": round(result.ppl, 3),
                          "criterion": criterion, "table": "compensation-aware" if aware else "plain",
                          "compensate": compensate, "sequential": sequential, "profiler": "auto",
                          "calib_samples": args.calib_samples,
                          "exact_entries": profile.table.n_exact(), "profiling_s": round(profile_s, 1),
                          "compensation_s": summary["wall_s"], "applied": summary.get("applied"),
                          "kept_original": summary.get("kept_original")})
            del pruned


if __name__ == "__main__":
    main()
