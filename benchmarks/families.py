"""GAP beyond SmolLM2: the allocator comparison, lsq, a reload check and zero-shot on another model.

Per `--model` (made for `gemma3-270m` and `qwen2.5-coder-0.5b`): the benchmark calibration
(`settings.CALIBRATION`: 32 windows x 128 tokens of WikiText-2 validation, the first 4 for ΔL) and
one auto-profiled loss table, grown ratio by ratio (ratios of the decoder layers' parameters by
default: Gemma 3 270M's embedding is 63% of its weights, so 50% of the model cannot be removed);
then per ratio GAP and the four baselines from that table without compensation, and GAP with `lsq`
(sequential, the product default). Perplexity: the first `--windows` windows of 128 tokens of the
WikiText-2 and PTB test splits (a BOS per window where the tokenizer adds one). The GAP `lsq` model
at the first ratio is saved, reloaded both ways and compared (logits, greedy tokens), and scored
zero-shot on the 7 tasks with the dense model.

Perplexities go to `--out` (allocators.json, records with `model`); profiling phases, the reload
check and zero-shot records to `--extra-out`. Resumable: what is in the files is skipped.

    python benchmarks/families.py --model gemma3-270m --data-dir ../shared/data
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from common import bench_config, evaluate_plan, parser, perplexities, reload_check
from result_log import ResultLog
from settings import ALLOCATORS, Window

from gapprune.api import load, pruned_copy, write_profile_folder
from gapprune.evaluate.zeroshot import TASKS, zero_shot
from gapprune.export.save import save
from gapprune.pipeline import (
    Profile,
    allocate,
    calibrate,
    plan_from_allocation,
    profile_model,
)
from gapprune.profiling.tables import complete_table, measure_table


def main() -> None:
    p = parser(__doc__, "docs/results/allocators.json")
    p.add_argument("--extra-out", default="docs/results/families.json")
    p.add_argument("--ratios", default="0.25,0.5")
    p.add_argument("--ratio-of", default="decoder", help="model or decoder: what the ratios are fractions of")
    p.add_argument("--windows", type=int, default=64)
    p.add_argument("--zeroshot-limit", type=int, default=100, help="first N examples per task (0: skip zero-shot)")
    p.add_argument("--folders", default="runs/families", help="where the saved GAP lsq folder goes")
    p.add_argument("--zeroshot-only", action="store_true", help="skip profiling and perplexities")
    p.add_argument("--exact-check", action="store_true",
                   help="also measure the exact table and compare its GAP plans with auto's (summed exact ΔL)")
    args = p.parse_args()
    ppl_log, extra_log = ResultLog(args.out), ResultLog(args.extra_out)
    done = {(r.get("allocator"), r.get("compensate"), r.get("target_ratio"), r.get("dataset"), r.get("windows"))
            for r in ppl_log.records if r.get("model") == args.model and r.get("profiler") == "auto"
            and (r.get("allocator") == "dense" or r.get("ratio_of", "model") == args.ratio_of)}
    phases_done = {(r.get("phase"), r.get("target_ratio")) for r in extra_log.records if r.get("kind") == "phase"
                   and r.get("model") == args.model and r.get("ratio_of", "model") == args.ratio_of}
    extras_done = {(r.get("kind"), r.get("stage"), r.get("task")) for r in extra_log.records
                   if r.get("model") == args.model and r.get("ratio_of", "model") == args.ratio_of}
    windows = [Window("wikitext2", windows=args.windows), Window("ptb", windows=args.windows)]
    ratios = [float(r) for r in args.ratios.split(",")]
    stage = f"gap{int(ratios[0] * 100)}-of-{args.ratio_of}-lsq"
    folder = Path(args.folders) / f"{args.model}-{stage}"

    model, tokenizer = load(args.model)
    # compensate lsq: the calibration collects the Gram statistics the lsq rows need
    config = bench_config(args.data_dir, compensate="lsq", profiler="auto", ratio_of=args.ratio_of)
    base = {"model": args.model, "criterion": config.criterion, "profiler": "auto", "seq_len": 128,
            "calib_samples": config.calib_samples, "profile_samples": config.profile_samples, "kind": "ppl",
            "ratio_of": args.ratio_of}

    def emit_ppl(allocator: str, compensate: str, ratio: float, achieved: tuple[float, float],
                 results: list[Any]) -> None:
        for window, result in results:
            ppl_log.emit({**base, "allocator": allocator, "compensate": compensate, "target_ratio": ratio,
                          "achieved_ratio": achieved[0], "decoder_ratio": achieved[1], "dataset": window.dataset,
                          "windows": window.windows,
                          "bos": result.bos, "ppl": result.ppl, "wall_s": result.wall_s})

    def todo(allocator: str, compensate: str, ratio: float) -> list[Window]:
        return [w for w in windows if (allocator, compensate, ratio, w.dataset, w.windows) not in done]

    if not args.zeroshot_only:  # perplexities, reload check, exact check
        emit_ppl("dense", "none", 0.0, (0.0, 0.0), perplexities(model, tokenizer, todo("dense", "none", 0.0), args.data_dir))
        start = time.perf_counter()
        calibration = calibrate(model, tokenizer, config)
        saved = Path(args.folders) / f"{args.model}-profile"  # the grown table, for a later run of this script
        if saved.exists():
            profile = Profile.load(saved)
            profile.check_matches(calibration, config)
        else:
            profile = profile_model(calibration, config, complete=False)
            if ("calibration_and_screen", None) not in phases_done:
                extra_log.emit({"model": args.model, "kind": "phase", "phase": "calibration_and_screen",
                                "ratio_of": args.ratio_of, "wall_s": round(time.perf_counter() - start, 1),
                                **{k: round(v, 1) for k, v in profile.timings.items()}})
        for ratio in ratios:
            start = time.perf_counter()
            profile.table = complete_table(calibration, profile.table, replace(config, ratio=ratio), profile.total_params)
            if ("auto_complete", ratio) not in phases_done:
                extra_log.emit({"model": args.model, "kind": "phase", "phase": "auto_complete", "target_ratio": ratio,
                                "ratio_of": args.ratio_of, "wall_s": round(time.perf_counter() - start, 1),
                                "exact_entries": profile.table.n_exact()})
            for name in ALLOCATORS:
                plan = plan_from_allocation(calibration.adapter, profile, allocate(profile, ratio, name, args.ratio_of),
                                            {**config.to_dict(), "ratio": ratio, "allocator": name})
                achieved = (plan.summary["achieved_ratio"], plan.summary["decoder_ratio"])
                if evals := todo(name, "none", ratio):
                    _, results = evaluate_plan(model, tokenizer, plan, evals, args.data_dir)
                    emit_ppl(name, "none", ratio, achieved, results)
                if name != "gap" or not (todo("gap", "lsq", ratio) or (ratio == ratios[0] and not folder.exists())):
                    continue
                pruned, _ = pruned_copy(model, plan, "lsq", calibration.gram, config.ridge, calibration.inputs)
                emit_ppl("gap", "lsq", ratio, achieved,
                         perplexities(pruned, tokenizer, todo("gap", "lsq", ratio), args.data_dir))
                if ratio == ratios[0] and not folder.exists():
                    save(pruned, tokenizer, folder, extras=lambda f, p=plan: p.save(f / "plan.json"))
                    extra_log.emit({"model": args.model, "kind": "reload", "target_ratio": ratio,
                                    "ratio_of": args.ratio_of,
                                    **reload_check(pruned, folder, tokenizer)})
                del pruned
        write_profile_folder(saved, profile, overwrite=True)
        if args.exact_check and not any(r["kind"] == "auto_vs_exact" for r in extra_log.records if r.get("model") == args.model):
            start = time.perf_counter()
            exact = measure_table(calibration, replace(config, profiler="exact"))
            exact_s = round(time.perf_counter() - start, 1)
            exact_profile = replace(profile, table=exact)
            for ratio in ratios:
                auto_choice = allocate(profile, ratio, "gap", args.ratio_of)
                best = allocate(exact_profile, ratio, "gap", args.ratio_of)
                extra_log.emit({"model": args.model, "kind": "auto_vs_exact", "target_ratio": ratio,
                                "ratio_of": args.ratio_of, "exact_table_s": exact_s,
                                "auto_exact_entries": profile.table.n_exact(), "exact_entries": exact.n_exact(),
                                "same_plan": auto_choice.choice == best.choice,
                                "auto_plan_exact_loss": auto_choice.predicted_loss(exact),
                                "exact_plan_exact_loss": best.predicted_loss(exact)})
    if args.zeroshot_limit <= 0:
        return
    for name, subject in (("dense", model), (stage, None)):
        if all(("zeroshot", name, t) in extras_done for t in TASKS):
            continue
        subject = subject if subject is not None else load(str(folder))[0]
        start = time.perf_counter()
        records = zero_shot(subject, tokenizer, list(TASKS), data_directory=args.data_dir, limit=args.zeroshot_limit)
        wall_s = round(time.perf_counter() - start, 1)
        for record in records:
            extra_log.emit({"model": args.model, "kind": "zeroshot", "stage": name, "ratio_of": args.ratio_of, **record,
                            "wall_s": wall_s})


if __name__ == "__main__":
    main()
