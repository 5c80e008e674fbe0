"""The auto profiler against the exact table at the CLI's defaults, and the LM head's logsumexp tiles.

    python benchmarks/profilers.py screen --data-dir ../shared/data --ratios 0.25,0.5 --variants float32:1,bfloat16:1
    python benchmarks/profilers.py tiles --threads 2

`screen`: the exact table's profiling time, then the auto profiler per screen variant
(precision:stride) and ratio from fresh checkpoints, each plan scored by its summed ΔL on that one
exact table. `tiles`: a replay's logsumexp (`engine.head.logsumexp_logits`) at several tile shapes,
for SmolLM2's and Qwen2.5-1.5B's heads. The finished studies' modes (timing, layers, calib, auto)
are in history: `git show fab99f7:benchmarks/profilers.py`.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch
from common import ResultLog

from gapprune.allocate import LayerSignals
from gapprune.api import load
from gapprune.config import PruneConfig
from gapprune.engine import head as head_module
from gapprune.evaluate.timing import median_seconds
from gapprune.models import COMPONENTS
from gapprune.pipeline import Profile, allocate, calibrate, plan_for
from gapprune.profiling.profilers import measure_table


def screen(args: argparse.Namespace, emit) -> None:  # type: ignore[no-untyped-def]
    """The CLI's defaults: the exact table timed, then `auto` per variant (screen precision:stride) and
    ratio from fresh checkpoints; every plan scored by its summed ΔL on that one exact table."""
    torch.set_num_threads(args.threads)
    model, tokenizer = load(args.model)
    config = PruneConfig(ratio=0.25, data_dir=args.data_dir)
    calibration = calibrate(model, tokenizer, config)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        exact = measure_table(calibration, replace(config, profiler="exact"), Path(folder))
    exact_s = round(time.perf_counter() - start, 1)
    total = sum(p.numel() for p in model.parameters())

    def summed(choice: dict[str, list[int]]) -> float:
        return sum(float(exact.loss[c][layer, k]) for c in choice for layer, k in enumerate(choice[c]))

    for ratio in map(float, args.ratios.split(",")):
        exact_plan = allocate(Profile(calibration.unit_scores, LayerSignals(), exact, total), ratio, "gap").choice
        for variant in args.variants.split(","):
            precision, stride = variant.split(":")
            variant_config = replace(config, ratio=ratio, screen_precision=precision, screen_stride=int(stride))
            with tempfile.TemporaryDirectory() as folder:
                timings: dict[str, float] = {}
                plan, profile = plan_for(variant_config, calibration, checkpoint_dir=Path(folder), timings=timings)
            choice, meta = plan.summary["choice"], profile.table.meta["auto"]
            emit({"kind": "auto_vs_exact", "profiler": "auto", "ratio": ratio, "screen_precision": precision,
                  "screen_stride": int(stride), "threads": args.threads, "wall_s": timings["profiling"],
                  "exact_wall_s": exact_s, "share_of_exact": round(timings["profiling"] / exact_s, 3),
                  "summed_dl_exact": round(summed(choice), 6), "exact_summed_dl_exact": round(summed(exact_plan), 6),
                  "same_components_as_exact_plan": sum(a == b for c in COMPONENTS
                                                       for a, b in zip(choice[c], exact_plan[c], strict=True)),
                  "exact_replays": sum(r["entries"] for r in meta["rounds"] if r["stage"] == "exact"),
                  "rounds": meta["rounds"],
                  "note": "wall_s and exact_wall_s: profiling alone (plan_for's phase; the exact table's measure_table)"})


def tiles(args: argparse.Namespace, emit) -> None:  # type: ignore[no-untyped-def]
    """A replay's logsumexp over a random head in tiles of rows x vocabulary slice: seconds per call."""
    torch.set_num_threads(args.threads)
    for vocab, hidden, rows in [(49_152, 576, 4096), (151_936, 1536, 2048)]:  # SmolLM2-135M, Qwen2.5-1.5B
        head, normed = torch.nn.Linear(hidden, vocab, bias=False), torch.randn(rows, hidden)
        for tile_rows, elements in [(2048, 1 << 24), (1024, 1 << 21), (1024, 1 << 20), (512, 1 << 20)]:
            head_module.LSE_TILE_ELEMENTS = {"cpu": elements}
            seconds = median_seconds(partial(head_module.logsumexp_logits, normed, head, tile_rows), repeats=3)
            emit({"kind": "lse_tiles", "vocab": vocab, "hidden": hidden, "rows": rows, "tile_rows": tile_rows,
                  "tile_vocab": elements // tile_rows, "seconds": round(seconds, 3), "threads": args.threads})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["screen", "tiles"])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--ratios", default="0.25,0.5", help="screen: ratios to plan for")
    parser.add_argument("--variants", default="float32:1", help="screen: screen precision:stride, comma-separated")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--out", default="docs/results/performance.json")
    args = parser.parse_args()
    log = ResultLog(args.out)
    {"screen": screen, "tiles": tiles}[args.mode](args, log.emit)


if __name__ == "__main__":
    main()
