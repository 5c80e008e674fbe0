"""Recovery on SmolLM2-135M: GAP at 25% and 50% with no compensation, `lsq`, `bias`, then LoRA on `lsq`.

One loss table for both ratios (the allocator benchmark's cache), the same calibration set for the
Gram statistics of compensation, and the same evaluation windows for every stage: the first
`--windows` windows of 128 tokens of the WikiText-2 and PTB test splits. The `lsq` models are saved
as pruned folders (`--folders`), then tuned with LoRA on Alpaca for `--lora-steps` steps and
evaluated again. Resumable: records already in --out are skipped.

    python benchmarks/recovery.py --data-dir ../shared/data --out docs/results/recovery.json
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import torch
from result_log import ResultLog

from gapprune.api import evaluate_ppl, load
from gapprune.config import PruneConfig
from gapprune.export.save import save
from gapprune.pipeline import allocate, plan_from_allocation, profile_model, prune_model_
from gapprune.tune.lora import TuneConfig, lora_tune

RATIOS = [0.25, 0.5]
STAGES = ["none", "lsq", "bias"]
DATASETS = ["wikitext2", "ptb"]


@torch.inference_mode()
def reload_check(model: torch.nn.Module, folder: Path, tokenizer) -> dict:  # type: ignore[no-untyped-def]
    """Logits and greedy text of the saved folder, loaded both ways, against the in-memory pruned model."""
    from transformers import AutoModelForCausalLM

    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    expected = model(input_ids=ids).logits
    text = model.generate(ids, max_new_tokens=8, do_sample=False)
    result = {}
    for way, loaded in (("gapprune.load", load(str(folder))[0]),
                        ("from_pretrained(trust_remote_code=True)",
                         AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval())):
        result[way] = {"identical_logits": bool(torch.equal(loaded(input_ids=ids).logits, expected)),
                       "identical_greedy_tokens": bool(torch.equal(loaded.generate(ids, max_new_tokens=8, do_sample=False), text))}
    return {"reload": result, "params": sum(p.numel() for p in model.parameters())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", default="docs/results/recovery.json")
    parser.add_argument("--table", default="runs/allocators_loss_table.json", help="loss table cache")
    parser.add_argument("--folders", default="runs", help="where the lsq-pruned and tuned folders go")
    parser.add_argument("--windows", type=int, default=256)
    parser.add_argument("--lora-steps", type=int, default=150)
    parser.add_argument("--lora-batch", type=int, default=4)
    parser.add_argument("--ridge", type=float, default=PruneConfig.__dataclass_fields__["ridge"].default)
    args = parser.parse_args()

    log = ResultLog(args.out)
    emit = log.emit
    done = {(r["ratio"], r["stage"], r["dataset"]) for r in log.records}

    def evaluate(m: torch.nn.Module, ratio: float, stage: str, extra: dict) -> None:
        for dataset in DATASETS:
            if (ratio, stage, dataset) in done:
                continue
            r = evaluate_ppl(m, tokenizer, dataset, seq_len=128, max_windows=args.windows, data_dir=args.data_dir)
            emit({"ratio": ratio, "stage": stage, "dataset": dataset, "seq_len": 128, "windows": r.windows,
                  "ppl": r.ppl, "wall_s": extra.get("wall_s"), "eval_s": r.wall_s, **extra})

    model, tokenizer = load(args.model)
    table = Path(args.table)
    config = PruneConfig(
        ratio=0.25, criterion="activation", calib_samples=32, profile_samples=4, seq_len=128, batch_size=4,
        mlp_stride=4, data_dir=args.data_dir, compensate="lsq", loss_table=str(table) if table.exists() else None,
    )
    profile = profile_model(model, tokenizer, config)  # also collects the Gram statistics (compensate != none)
    if not table.exists():
        table.parent.mkdir(parents=True, exist_ok=True)
        profile.table.save(table)
    evaluate(model, 0.0, "dense", {})
    for ratio in RATIOS:
        plan = plan_from_allocation(profile, allocate(profile, ratio, "gap"), {**config.to_dict(), "ratio": ratio})
        folder = Path(args.folders) / f"gap{int(ratio * 100)}_lsq"
        for stage in STAGES:
            pruned = copy.deepcopy(model)
            start = time.perf_counter()
            summary = prune_model_(pruned, plan, stage, profile.gram, args.ridge)
            extra = {"wall_s": round(time.perf_counter() - start, 3), "achieved_ratio": plan.summary["achieved_ratio"],
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
