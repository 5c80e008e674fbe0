"""Recovery of a pruned folder at equal tuning time: LoRA on Alpaca (today's `tune`), distillation
with LoRA, distillation of all parameters. Settings live here; the work is `gapprune.tune`.

    python benchmarks/distill.py --pruned runs/smollm2-gap-25 --ratio 0.25 --method distill-all \
        --minutes 10 --run-dir runs/distill/25-all --out docs/results/recovery.json [--zeroshot]

The run folder keeps the checkpoint: the same command with more `--minutes` continues the run
(the time limit counts all parts; the rate is constant after warm-up, so a continued run is the
longer run's prefix). Records: perplexity on the first 256 windows of 128 tokens of WikiText-2 and
PTB test, and (with --zeroshot) the 7 tasks at 500 examples each.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATASETS, TASKS, ResultLog, Window, parser, perplexity

# What each method trains; every method sees the same text (Alpaca) unless --data says otherwise.
METHODS = {
    "lora": {},  # TuneConfig defaults: rank 8, lr 1e-4, 4 examples of <= 256 tokens per step
    "distill-lora": {"params": "lora", "rank": 8},  # lr 5e-4
    "distill-all": {"params": "all"},  # lr 1e-4
    "distill-decoder": {"params": "decoder"},  # lr 1e-4; embeddings, final norm and head frozen
}
# Windows of 128 tokens, 8 per step; a short warm-up; 16 held-out windows for the validation KL.
# (The 10-minute runs of 2026-11-30 on a loaded machine used warmup 1, val_windows 4, eval_every 25,
# save_every 5: their records carry those settings.)
DISTILL = {"seq_len": 128, "batch_size": 8, "micro_batch": 4, "val_windows": 16, "eval_every": 50, "save_every": 25,
           "warmup": 10}
ZEROSHOT_LIMIT = 500


def tune(method: str, model: torch.nn.Module, tokenizer, args) -> tuple[torch.nn.Module, dict]:  # type: ignore[no-untyped-def]
    """Train for `args.minutes` of training time in all; returns the model and a flat record."""
    from gapprune.tune import DistillConfig, TuneConfig, distill, lora_tune

    seconds = args.minutes * 60
    run_dir = Path(args.run_dir)
    if method == "lora":
        config = TuneConfig(data=args.data, data_dir=args.data_dir, max_seconds=seconds, max_steps=args.max_steps,
                            save_every=25, eval_every=50)
        model, result = lora_tune(model, tokenizer, config, run_dir / "ckpt")
        return model, {"steps": result.steps, "tokens": result.tokens, "examples": result.examples_seen,
                       "wall_s": result.wall_s, "train_s": result.wall_s, "val_loss": result.val_loss,
                       "lr": config.lr, "settings": asdict(config)}
    config = DistillConfig(data=args.data, data_dir=args.data_dir, max_seconds=seconds, max_steps=args.max_steps,
                           teacher=args.teacher, self_windows=args.self_windows, schedule=args.schedule,
                           decay_fraction=args.decay_fraction,
                           top_k=args.top_k, teacher_cache=args.teacher_cache,
                           **{**DISTILL, "batch_size": args.batch_size, "micro_batch": min(DISTILL["micro_batch"], args.batch_size)},
                           **{**METHODS[method], **({"lr": args.lr} if args.lr else {})})
    model, result = distill(model, tokenizer, config, checkpoint_dir=run_dir / "ckpt")
    return model, {"steps": result.steps, "tokens": result.tokens, "wall_s": result.wall_s, "train_s": result.train_s,
                   "val_kl": result.val_kl, "teacher": result.teacher, "data_windows": result.data,
                   "cache_hits": result.cache_hits,
                   "lr": config.learning_rate, "settings": asdict(config)}


def zeroshot_of_finished_run(args, source: str, log: ResultLog) -> None:  # type: ignore[no-untyped-def]
    """Zero-shot records for a run that ended without --zeroshot: its saved model, its step count."""
    import json

    from gapprune.api import load
    from gapprune.evaluate.zeroshot import zero_shot

    run_dir = Path(args.run_dir)
    steps = json.loads((run_dir / "ckpt" / "trainer_state.json").read_text())["step"]
    model, tokenizer = load(str(run_dir / "model"))
    label = {"model": source, "method": f"{args.method}:{args.data}", "ratio": args.ratio}
    for r in zero_shot(model, tokenizer, TASKS, data_directory=args.data_dir, limit=ZEROSHOT_LIMIT):
        log.emit({"kind": "zeroshot", **label, **r, "steps": steps, "minutes": args.minutes})


def main() -> None:
    p = parser(__doc__, out="docs/results/recovery.json")
    p.add_argument("--pruned", required=True, help="pruned folder (gapprune prune ... --out)")
    p.add_argument("--ratio", type=float, required=True)
    p.add_argument("--method", choices=sorted(METHODS), required=True)
    p.add_argument("--data", default="alpaca", help="training text (self, alpaca, a file; joined by +)")
    p.add_argument("--teacher", default=None)
    p.add_argument("--self-windows", type=int, default=128, help="windows of teacher-written text (data self)")
    p.add_argument("--minutes", type=float, required=True, help="training time in all (resumed parts included)")
    p.add_argument("--max-steps", type=int, default=100_000,
                   help="stop at this step (to score a killed run at its last checkpoint without more training)")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--zeroshot", action="store_true")
    p.add_argument("--zeroshot-only", action="store_true",
                   help="no training: the 7 tasks on the run folder's saved model (a finished run)")
    p.add_argument("--windows", type=int, default=256, help="perplexity on the first N windows of 128 tokens")
    p.add_argument("--lr", type=float, default=0.0, help="learning rate (0: the method's default)")
    p.add_argument("--schedule", default="constant", choices=["constant", "cosine", "wsd"], help="rate after warm-up")
    p.add_argument("--decay-fraction", type=float, default=0.2, help="wsd: final share of the time over which the rate falls to 0")
    p.add_argument("--start-point", action="store_true", help="first record the pruned folder's own perplexity")
    p.add_argument("--start-point-only", action="store_true", help="record the pruned folder's own perplexity, no training")
    p.add_argument("--batch-size", type=int, default=DISTILL["batch_size"], help="windows per optimiser step")
    p.add_argument("--top-k", type=int, default=0, help="KL over the teacher's top-k plus a tail bucket (0: full vocabulary)")
    p.add_argument("--teacher-cache", default=None, help="keep the teacher's top-k on disk (a folder, or auto); needs --top-k")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from gapprune.api import load
    from gapprune.export.save import save

    log = ResultLog(args.out)
    model, tokenizer = load(args.pruned)
    from gapprune.tune.teacher import resolve_teacher

    source = args.teacher or resolve_teacher(model.config)  # the dense model the folder was pruned from
    if args.zeroshot_only:
        del model  # only its config was needed: the run's own saved model is scored
        zeroshot_of_finished_run(args, source, log)
        return
    windows = [Window(dataset, windows=args.windows) for dataset in DATASETS]
    if args.start_point or args.start_point_only:
        for window in windows:
            ppl = perplexity(model, tokenizer, window, args.data_dir)
            log.emit({"kind": "methods", "dataset": window.dataset, "seq_len": 128, "windows": ppl["windows"],
                      "ppl": round(ppl["ppl"], 3), "model": source, "method": "none (starting point of the distillation runs)",
                      "ratio": args.ratio, "train_data": None, "pruned": args.pruned, "steps": 0, "tokens": 0,
                      "wall_s": 0.0})
    if args.start_point_only:
        return
    start = time.perf_counter()
    model, record = tune(args.method, model, tokenizer, args)
    save(model, tokenizer, Path(args.run_dir) / "model", overwrite=True)
    label = {"model": source, "method": f"{args.method}:{args.data}", "ratio": args.ratio}
    base = {**label, "train_data": args.data, "schedule": args.schedule, "minutes": args.minutes, "pruned": args.pruned, **record,
            "tune_wall_s": round(time.perf_counter() - start, 1)}
    for window in windows:
        ppl = perplexity(model, tokenizer, window, args.data_dir)
        log.emit({"kind": "methods", "dataset": window.dataset, "seq_len": 128, "windows": ppl["windows"],
                  "ppl": round(ppl["ppl"], 3), **base})
    if args.zeroshot:
        from gapprune.evaluate.zeroshot import zero_shot

        for r in zero_shot(model, tokenizer, TASKS, data_directory=args.data_dir, limit=ZEROSHOT_LIMIT):
            log.emit({"kind": "zeroshot", **label, **r, "steps": record["steps"], "train_s": record["train_s"]})


if __name__ == "__main__":
    main()
