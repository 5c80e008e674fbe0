"""Compare allocators on SmolLM2-135M: one loss table, every allocator, four ratios.

Same calibration set (WikiText-2 validation), same criterion (activation), no compensation.
Evaluation: first 256 windows x 128 of WikiText-2 test and PTB test, first 16 windows x 2048 of
WikiText-2 test, and the full WikiText-2 test at 128 for GAP and the best baseline at 25%.
Resumable: records already in --out are skipped.

    python benchmarks/allocators.py --data-dir ../shared/data --out docs/results/allocators.json
"""

from __future__ import annotations

import time

from common import add_profile_flag, bench_config, calibrate_and_profile, evaluate_plan, parser, perplexities
from result_log import ResultLog
from settings import ALLOCATOR_WINDOWS, ALLOCATORS, CALIBRATION, RATIOS, Window

from gapprune.api import load
from gapprune.pipeline import allocate, plan_from_allocation


def main() -> None:
    p = parser(__doc__, "docs/results/allocators.json")
    add_profile_flag(p)
    p.add_argument("--calib-samples", type=int, default=CALIBRATION["calib_samples"])
    p.add_argument("--profile-samples", type=int, default=CALIBRATION["profile_samples"])
    p.add_argument("--mlp-stride", type=int, default=CALIBRATION["mlp_stride"])
    p.add_argument("--skip-full", action="store_true", help="skip the full WikiText-2 test runs")
    args = p.parse_args()

    log = ResultLog(args.out)
    done = {(r.get("allocator"), r.get("target_ratio"), r.get("dataset"), r.get("seq_len"), r.get("windows"))
            for r in log.records}
    model, tokenizer = load(args.model)
    config = bench_config(args.data_dir, calib_samples=args.calib_samples, profile_samples=args.profile_samples,
                          mlp_stride=args.mlp_stride)
    calibration, profile, fresh = calibrate_and_profile(model, tokenizer, config, args.profile)
    if fresh:  # phases of a fresh profile (a cached one records its own wall_s)
        for phase, seconds in profile.timings.items():
            log.emit({"kind": "phase", "phase": phase, "wall_s": seconds, "tokens_profiled": profile.table.meta.get("tokens")})

    def emit_ppl(allocator: str, ratio: float, achieved: float, results: list) -> None:  # type: ignore[type-arg]
        for _, result in results:
            log.emit({
                "allocator": allocator, "criterion": config.criterion, "target_ratio": ratio, "achieved_ratio": achieved,
                "dataset": result.dataset, "seq_len": result.seq_len, "windows": result.windows, "ppl": result.ppl,
                "kind": "ppl", "wall_s": result.wall_s,
            })

    def todo(allocator: str, ratio: float, evals: list[Window]) -> list[Window]:
        return [w for w in evals if (allocator, ratio, w.dataset, w.seq_len, w.windows) not in done]

    emit_ppl("dense", 0.0, 0.0, perplexities(model, tokenizer, todo("dense", 0.0, ALLOCATOR_WINDOWS), args.data_dir))
    for ratio in RATIOS:
        for name in ALLOCATORS:
            evals = todo(name, ratio, ALLOCATOR_WINDOWS)
            if not evals:
                continue
            start = time.perf_counter()
            allocation = allocate(profile, ratio, name)
            plan = plan_from_allocation(calibration.adapter, profile, allocation,
                                        {**config.to_dict(), "ratio": ratio, "allocator": name})
            dp_s = time.perf_counter() - start
            summary, results = evaluate_plan(model, tokenizer, plan, evals, args.data_dir)
            log.emit({"kind": "phase", "phase": "allocation", "allocator": name, "target_ratio": ratio,
                      "wall_s": round(dp_s, 4), "predicted_loss": plan.summary["predicted_loss"]})
            log.emit({"kind": "phase", "phase": "surgery", "allocator": name, "target_ratio": ratio,
                      "wall_s": summary["wall_s"], "kept_heads": [len(l.attn.kept) for l in plan.layers],
                      "kept_channels": [len(l.mlp.kept) for l in plan.layers]})
            emit_ppl(name, ratio, plan.summary["achieved_ratio"], results)
    if args.skip_full:
        return
    ratio = 0.25
    cells = [r for r in log.records if r.get("kind") == "ppl" and r["target_ratio"] == ratio
             and r["dataset"] == "wikitext2" and r["seq_len"] == 128 and r["windows"] == 256]
    baselines = sorted((r for r in cells if r["allocator"] not in ("gap", "dense")), key=lambda r: r["ppl"])
    for name in ["gap", baselines[0]["allocator"]]:
        evals = todo(name, ratio, [Window("wikitext2", 128, None)])
        if not evals:
            continue
        plan = plan_from_allocation(calibration.adapter, profile, allocate(profile, ratio, name), {"ratio": ratio})
        _, results = evaluate_plan(model, tokenizer, plan, evals, args.data_dir)
        emit_ppl(name, ratio, plan.summary["achieved_ratio"], results)


if __name__ == "__main__":
    main()
