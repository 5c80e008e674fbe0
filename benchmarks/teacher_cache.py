"""What the teacher cache saves: seconds per distillation step with the teacher on the fly (full
vocabulary, the default), with its top-k on the fly while the cache fills, and with the top-k read
back from the cache (the same windows again, as in a second epoch or a second student).

    python benchmarks/teacher_cache.py --pruned runs/smollm2-gap-25 --steps 15 --threads 2 \
        --cache runs/teacher_topk --out docs/results/recovery.json

The settings are those of `distill.py` (8 windows of 128 tokens a step, Alpaca, decoder layers).
"""

from __future__ import annotations

import copy
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ResultLog, parser
from distill import DISTILL, METHODS


def main() -> None:
    p = parser(__doc__, out="docs/results/recovery.json")
    p.add_argument("--pruned", required=True)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--top-k", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cache", required=True, help="teacher-cache folder (emptied first)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from gapprune.api import load
    from gapprune.tune import DistillConfig, distill
    from gapprune.tune.teacher import load_teacher, resolve_teacher

    student, tokenizer = load(args.pruned)
    teacher_id = resolve_teacher(student.config)
    teacher, teacher_tokenizer = load_teacher(teacher_id)
    shutil.rmtree(args.cache, ignore_errors=True)
    log = ResultLog(args.out)
    base = {"data": "alpaca", "data_dir": args.data_dir, "max_steps": args.steps, "teacher": teacher_id,
            "eval_every": 10**6, "save_every": 10**6, **DISTILL, **METHODS["distill-decoder"]}
    runs = [("full vocabulary, on the fly", {}),
            (f"top-{args.top_k}, on the fly, filling the cache", {"top_k": args.top_k, "teacher_cache": args.cache}),
            (f"top-{args.top_k}, read from the cache", {"top_k": args.top_k, "teacher_cache": args.cache})]
    losses = {}
    for name, changes in runs:
        config = DistillConfig(**{**base, **changes})
        _, result = distill(copy.deepcopy(student), tokenizer, config, teacher=teacher,
                            teacher_tokenizer=teacher_tokenizer)
        losses[name] = result.train_loss
        log.emit({"kind": "teacher_cache", "model": teacher_id, "pruned": args.pruned, "run": name,
                  "steps": result.steps, "train_s": result.train_s,
                  "s_per_step": round(result.train_s / max(result.steps, 1), 3), "cache_hits": result.cache_hits,
                  "micro_batches": result.steps * DISTILL["batch_size"] // DISTILL["micro_batch"],
                  "same_losses_as_filling_run": losses[runs[1][0]] == result.train_loss if name == runs[2][0] else None,
                  "settings": asdict(config)})


if __name__ == "__main__":
    main()
