"""Compare allocators on SmolLM2-135M: one loss table, every allocator, four ratios.

Same calibration set (WikiText-2 validation), same criterion (activation), no compensation.
Evaluation: first 256 windows x 128 of WikiText-2 test and PTB test, first 16 windows x 2048 of
WikiText-2 test, and the full WikiText-2 test at 128 for GAP and the best baseline at 25%.
Resumable: records already in --out are skipped.

    python benchmarks/allocators.py --data-dir ../shared/data --out docs/results/allocators.json
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
import time
from datetime import date
from pathlib import Path

import torch

from gapprune.api import evaluate_ppl, load
from gapprune.config import PruneConfig
from gapprune.pipeline import allocate, plan_from_allocation, profile_model, prune_model_

EVALS = [("wikitext2", 128, 256), ("ptb", 128, 256), ("wikitext2", 2048, 16)]
ALLOCATORS = ["gap", "uniform", "global", "depth", "owl"]
RATIOS = [0.125, 0.25, 0.375, 0.5]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", default="docs/results/allocators.json")
    parser.add_argument("--table", default="runs/allocators_loss_table.json", help="loss table cache")
    parser.add_argument("--calib-samples", type=int, default=32)
    parser.add_argument("--profile-samples", type=int, default=4)
    parser.add_argument("--mlp-stride", type=int, default=4)
    parser.add_argument("--skip-full", action="store_true", help="skip the full WikiText-2 test runs")
    args = parser.parse_args()

    out = Path(args.out)
    records: list[dict] = json.loads(out.read_text()) if out.exists() else []
    done = {(r.get("allocator"), r.get("target_ratio"), r.get("dataset"), r.get("seq_len"), r.get("windows")) for r in records}
    meta = {
        "date": str(date.today()),
        "machine": f"{platform.machine()} CPU, {torch.get_num_threads()} threads, torch {torch.__version__}",
        "command": "python " + " ".join(sys.argv),
    }

    def emit(record: dict) -> None:
        record = {**record, **meta}
        print(json.dumps(record), flush=True)
        records.append(record)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(records, indent=1) + "\n")

    model, tokenizer = load(args.model)
    table_path = Path(args.table)
    config = PruneConfig(
        ratio=0.25, allocator="gap", criterion="activation", metric="kl", calib="wikitext2", calib_split="validation",
        calib_samples=args.calib_samples, profile_samples=args.profile_samples, seq_len=128, batch_size=4,
        mlp_stride=args.mlp_stride, data_dir=args.data_dir, compensate="none",
        loss_table=str(table_path) if table_path.exists() else None,
    )
    profile = profile_model(model, tokenizer, config)
    if not table_path.exists():
        table_path.parent.mkdir(parents=True, exist_ok=True)
        profile.table.save(table_path)
    if not config.loss_table:  # phases of a fresh profile (a cached table records its own wall_s)
        for phase, seconds in profile.timings.items():
            emit({"kind": "phase", "phase": phase, "wall_s": seconds, "tokens_profiled": profile.table.meta.get("tokens")})

    def evaluate(m: torch.nn.Module, allocator: str, ratio: float, achieved: float, evals: list) -> None:
        for dataset, seq_len, windows in evals:
            if (allocator, ratio, dataset, seq_len, windows) in done:
                continue
            result = evaluate_ppl(m, tokenizer, dataset, seq_len=seq_len, max_windows=windows, data_dir=args.data_dir)
            emit({
                "allocator": allocator, "criterion": "activation", "target_ratio": ratio, "achieved_ratio": achieved,
                "dataset": dataset, "seq_len": seq_len, "windows": result.windows, "ppl": result.ppl,
                "kind": "ppl", "wall_s": result.wall_s,
            })

    evaluate(model, "dense", 0.0, 0.0, EVALS)
    for ratio in RATIOS:
        for name in ALLOCATORS:
            if all((name, ratio, d, s, w) in done for d, s, w in EVALS):
                continue
            start = time.perf_counter()
            allocation = allocate(profile, ratio, name)
            plan = plan_from_allocation(profile, allocation, {**config.to_dict(), "ratio": ratio, "allocator": name})
            dp_s = time.perf_counter() - start
            pruned = copy.deepcopy(model)
            start = time.perf_counter()
            prune_model_(pruned, plan)
            emit({"kind": "phase", "phase": "allocation", "allocator": name, "target_ratio": ratio, "wall_s": round(dp_s, 4),
                  "predicted_loss": plan.summary["predicted_loss"]})
            emit({"kind": "phase", "phase": "surgery", "allocator": name, "target_ratio": ratio,
                  "wall_s": round(time.perf_counter() - start, 4), "kept_heads": [len(l.attn.kept) for l in plan.layers],
                  "kept_channels": [len(l.mlp.kept) for l in plan.layers]})
            evaluate(pruned, name, ratio, plan.summary["achieved_ratio"], EVALS)
            del pruned
    if args.skip_full:
        return
    ratio = 0.25
    cells = [r for r in records if r.get("kind") == "ppl" and r["target_ratio"] == ratio and r["dataset"] == "wikitext2"
             and r["seq_len"] == 128 and r["windows"] == 256]
    baselines = sorted((r for r in cells if r["allocator"] not in ("gap", "dense")), key=lambda r: r["ppl"])
    for name in ["gap", baselines[0]["allocator"]]:
        plan = plan_from_allocation(profile, allocate(profile, ratio, name), {"ratio": ratio})
        pruned = copy.deepcopy(model)
        prune_model_(pruned, plan)
        evaluate(pruned, name, ratio, plan.summary["achieved_ratio"], [("wikitext2", 128, None)])


if __name__ == "__main__":
    main()
