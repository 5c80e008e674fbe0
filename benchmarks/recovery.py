"""Recovery on SmolLM2-135M: GAP at 25% and 50% with no compensation, `lsq`, `bias`, then LoRA on `lsq`.

One profile for both ratios (the shared benchmark profile), the same calibration set for the
Gram statistics of compensation, and the same evaluation windows for every stage: the first
`--windows` windows of 128 tokens of the WikiText-2 and PTB test splits. The `lsq` models are saved
as pruned folders (`--folders`), then tuned with LoRA on Alpaca for `--lora-steps` steps and
evaluated again. Resumable: records already in --out are skipped.

    python benchmarks/recovery.py --data-dir ../shared/data --out docs/results/recovery.json
"""

from __future__ import annotations

from pathlib import Path

import torch
from common import add_profile_flag, bench_config, calibrate_and_profile, parser, perplexities, reload_check
from result_log import ResultLog
from settings import DATASETS, SEQ_LEN, Window

from gapprune.api import load, pruned_copy
from gapprune.config import PruneConfig
from gapprune.export.save import save
from gapprune.pipeline import allocate, plan_from_allocation
from gapprune.tune.lora import TuneConfig, lora_tune

RATIOS = [0.25, 0.5]
STAGES = ["none", "lsq", "bias"]


def main() -> None:
    p = parser(__doc__, "docs/results/recovery.json")
    add_profile_flag(p)
    p.add_argument("--folders", default="runs", help="where the lsq-pruned and tuned folders go")
    p.add_argument("--windows", type=int, default=256)
    p.add_argument("--lora-steps", type=int, default=150)
    p.add_argument("--lora-batch", type=int, default=4)
    p.add_argument("--ridge", type=float, default=PruneConfig.__dataclass_fields__["ridge"].default)
    args = p.parse_args()

    log = ResultLog(args.out)
    emit = log.emit
    done = {(r["ratio"], r["stage"], r["dataset"]) for r in log.records}

    def evaluate(m: torch.nn.Module, ratio: float, stage: str, extra: dict) -> None:
        windows = [Window(d, SEQ_LEN, args.windows) for d in DATASETS if (ratio, stage, d) not in done]
        for window, r in perplexities(m, tokenizer, windows, args.data_dir):
            emit({"ratio": ratio, "stage": stage, "dataset": window.dataset, "seq_len": window.seq_len, "windows": r.windows,
                  "ppl": r.ppl, "wall_s": extra.get("wall_s"), "eval_s": r.wall_s, **extra})

    model, tokenizer = load(args.model)
    config = bench_config(args.data_dir, compensate="lsq")  # lsq: the calibration collects Gram statistics
    calibration, profile, _ = calibrate_and_profile(model, tokenizer, config, args.profile)
    evaluate(model, 0.0, "dense", {})
    for ratio in RATIOS:
        plan = plan_from_allocation(calibration.adapter, profile, allocate(profile, ratio, "gap"),
                                    {**config.to_dict(), "ratio": ratio})
        folder = Path(args.folders) / f"gap{int(ratio * 100)}_lsq"
        for stage in STAGES:
            pruned, summary = pruned_copy(model, plan, stage, calibration.gram, args.ridge)
            extra = {"wall_s": round(summary["wall_s"], 3), "achieved_ratio": plan.summary["achieved_ratio"],
                     "compensated": summary.get("applied"), "kept_original": summary.get("kept_original")}
            evaluate(pruned, ratio, stage, extra)
            if stage == "lsq" and not folder.exists():
                save(pruned, tokenizer, folder, extras=lambda f, p=plan: p.save(f / "plan.json"))
                emit({"ratio": ratio, "stage": "reload", "dataset": "-", **reload_check(pruned, folder, tokenizer)})
            del pruned
        if all((ratio, "lora", d) in done for d in DATASETS):
            continue
        pruned, _ = load(str(folder))
        tune = TuneConfig(data="alpaca", data_dir=args.data_dir, max_steps=args.lora_steps, batch_size=args.lora_batch,
                          val_examples=32, eval_every=50, save_every=10**9)
        tuned, result = lora_tune(pruned, tokenizer, tune)
        save(tuned, tokenizer, Path(args.folders) / f"gap{int(ratio * 100)}_lora", overwrite=True)
        evaluate(tuned, ratio, "lora", {
            "wall_s": result.wall_s, "lora_steps": result.steps, "lora_examples": result.examples_seen,
            "lora_batch": args.lora_batch, "cutoff": tune.cutoff, "rank": tune.rank, "lr": tune.lr,
            "val_loss": result.val_loss, "achieved_ratio": plan.summary["achieved_ratio"],
        })


if __name__ == "__main__":
    main()
