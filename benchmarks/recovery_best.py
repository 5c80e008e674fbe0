"""Recovery from the best one-shot setting: GAP with obs + sequential lsq (the defaults), then LoRA.

SmolLM2-135M at `--ratio` (25%), the benchmark calibration (`settings.CALIBRATION`, criterion obs)
and the auto profiler. Stages: `obs+sequential` (pruned and compensated, saved) and
`obs+sequential+lora` (LoRA rank 8 on Alpaca, `gapprune tune` defaults, `--lora-steps` steps of
`--lora-batch` examples, merged). Each stage: WikiText-2 and PTB perplexity (first 256 windows of
128) and, after LoRA (and before, with `--zeroshot-before`), zero-shot accuracy on the 7 tasks
(first `--limit` examples each). The dense model's zero-shot at the same limit is taken from
`--dense-eval` when it holds all 7 tasks at that limit, else measured. Records go to recovery.json
(`kind` "methods" for perplexity, "zeroshot" for accuracy). Resumable.

    python benchmarks/recovery_best.py --data-dir ../shared/data --out docs/results/recovery.json
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from common import bench_config, parser, perplexities
from result_log import ResultLog
from settings import DATASETS, Window

from gapprune.api import load, prune
from gapprune.evaluate.zeroshot import TASKS, zero_shot
from gapprune.export.save import save
from gapprune.tune.lora import TuneConfig, lora_tune


def main() -> None:
    p = parser(__doc__, "docs/results/recovery.json")
    p.add_argument("--ratio", type=float, default=0.25)
    p.add_argument("--windows", type=int, default=256)
    p.add_argument("--limit", type=int, default=500, help="zero-shot: first N examples per task")
    p.add_argument("--lora-steps", type=int, default=300)
    p.add_argument("--lora-batch", type=int, default=4)
    p.add_argument("--zeroshot-before", action="store_true", help="also score the model before LoRA")
    p.add_argument("--dense-eval", default="docs/results/eval.json", help="dense zero-shot records to reuse")
    p.add_argument("--folders", default="runs/recovery_best")
    args = p.parse_args()
    log = ResultLog(args.out)
    method = "obs+sequential"
    done = {(r.get("kind"), r.get("method"), r.get("ratio"), r.get("dataset") or r.get("task")) for r in log.records}
    windows = [Window(d, windows=args.windows) for d in DATASETS]

    def measure(model: torch.nn.Module, stage: str, zeroshot: bool, extra: dict) -> None:  # type: ignore[type-arg]
        todo = [w for w in windows if ("methods", stage, args.ratio, w.dataset) not in done]
        for window, result in perplexities(model, tokenizer, todo, args.data_dir):
            log.emit({"kind": "methods", "method": stage, "ratio": args.ratio, "dataset": window.dataset,
                      "seq_len": window.seq_len, "windows": window.windows, "ppl": round(result.ppl, 3), **extra})
        if zeroshot and not all(("zeroshot", stage, args.ratio, t) in done for t in TASKS):
            for record in zero_shot(model, tokenizer, list(TASKS), data_directory=args.data_dir, limit=args.limit):
                log.emit({"kind": "zeroshot", "method": stage, "ratio": args.ratio, **record})

    model, tokenizer = load(args.model)
    dense = [r for r in json.loads(Path(args.dense_eval).read_text()) if r["ratio"] == 0.0 and r["limit"] == args.limit]
    if {r["task"] for r in dense} == set(TASKS):
        for r in dense:
            if ("zeroshot", "dense", 0.0, r["task"]) not in done:
                log.emit({"kind": "zeroshot", "method": "dense", "ratio": 0.0, "task": r["task"], "metric": r["metric"],
                          "value": r["value"], "stderr": r["stderr"], "limit": r["limit"],
                          "measured": f"{r['date']}, {r['command']}"})
    else:
        measure(model, "dense", True, {})
    folder = Path(args.folders) / f"gap{int(args.ratio * 100)}_obs_sequential"
    config = bench_config(args.data_dir, ratio=args.ratio, criterion="obs", compensate="lsq", profiler="auto")
    if not folder.exists():
        plan, _ = prune(model, tokenizer, config)
        save(model, tokenizer, folder, extras=lambda f: plan.save(f / "plan.json"))
    pruned, _ = load(str(folder))
    measure(pruned, method, args.zeroshot_before, {"criterion": "obs", "compensate": "lsq", "sequential": True})
    tune = TuneConfig(data="alpaca", data_dir=args.data_dir, max_steps=args.lora_steps, batch_size=args.lora_batch,
                      val_examples=32, eval_every=100, save_every=10**9)
    tuned_folder = folder.with_name(folder.name + "_lora")
    if tuned_folder.exists():
        tuned, extra = load(str(tuned_folder))[0], {}
    else:
        tuned, result = lora_tune(pruned, tokenizer, tune)
        save(tuned, tokenizer, tuned_folder)
        extra = {"wall_s": result.wall_s, "lora_steps": result.steps, "lora_examples": result.examples_seen,
                 "lora_batch": args.lora_batch, "cutoff": tune.cutoff, "rank": tune.rank, "lr": tune.lr,
                 "val_loss": result.val_loss}
    measure(tuned, method + "+lora", True, extra)


if __name__ == "__main__":
    main()
