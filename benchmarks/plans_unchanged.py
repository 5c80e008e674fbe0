"""Recompute the allocator benchmark's plans with the current code and compare them with the recorded ones.

The perplexities in docs/results/allocators.json follow from the plans (kept heads and channels per
layer, recorded with each surgery phase) and deterministic evaluation, so identical plans mean the
recorded numbers still hold for the current code without re-running the 40 perplexity evaluations.

    python benchmarks/plans_unchanged.py --data-dir ../shared/data
"""

from __future__ import annotations

import argparse
import json
import time

from common import bench_config, calibrate_and_profile
from settings import ALLOCATORS, MODEL, PROFILE, RATIOS

from gapprune.api import load
from gapprune.pipeline import allocate, plan_from_allocation

p = argparse.ArgumentParser()
p.add_argument("--data-dir", default=None)
p.add_argument("--records", default="docs/results/allocators.json")
args = p.parse_args()
records = json.load(open(args.records))
old = {(r["allocator"], r["target_ratio"]): (r["kept_heads"], r["kept_channels"]) for r in records
       if r["kind"] == "phase" and r.get("phase") == "surgery" and r.get("model", MODEL) == MODEL}
model, tokenizer = load(MODEL)
start = time.time()
config = bench_config(args.data_dir)
calibration, profile, fresh = calibrate_and_profile(model, tokenizer, config, PROFILE)
print("profile", fresh, round(time.time() - start), profile.timings, flush=True)
same = 0
for ratio in RATIOS:
    for name in ALLOCATORS:
        plan = plan_from_allocation(calibration.adapter, profile, allocate(profile, ratio, name), {"ratio": ratio})
        heads = [len(lp.attn.kept) for lp in plan.layers]
        channels = [len(lp.mlp.kept) for lp in plan.layers]
        ok = old.get((name, ratio)) == (heads, channels)
        same += ok
        print(name, ratio, "same" if ok else f"DIFFERENT {heads} {channels} vs {old.get((name, ratio))}", flush=True)
print(f"{same} of {len(RATIOS) * len(ALLOCATORS)} plans identical to the recorded ones")
