"""The 20 allocator plans of SmolLM2-135M recomputed and compared with their records: a change to profiling,
allocation or the DP must leave them as they were, or show why.

    python benchmarks/plans.py --data-dir ../shared/data

GAP and the four baselines at four ratios, all from one exact loss table at the benchmarks' calibration
(`common.CALIBRATION`), against the kept heads and channels per layer of `allocators.json`'s surgery
records; the GAP plans at 25% and 50% also against the achieved ratios in `recovery.json`. The exact
profile is read from `--profile` when it is there (the plans then need no calibration), else measured
and written there (about 20 minutes on two cores).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ALLOCATORS, MODEL, PROFILE, RATIOS, bench_config

from gapprune.api import load, write_profile_folder
from gapprune.models import get_adapter
from gapprune.pipeline import Profile, calibrate, plan_for

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"


def recorded_plans() -> dict[tuple[str, float], tuple[list[int], list[int]]]:
    """(allocator, ratio) -> kept heads and kept channels per layer, as the allocator study recorded them."""
    return {(r["allocator"], r["target_ratio"]): (r["kept_heads"], r["kept_channels"])
            for r in json.loads((RESULTS / "allocators.json").read_text())
            if r.get("phase") == "surgery" and r.get("model", "smollm2-135m") == "smollm2-135m"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=MODEL)
    p.add_argument("--data-dir", default=None, help="data folder (else $GAPPRUNE_DATA)")
    p.add_argument("--profile", default=PROFILE, help="the exact profile folder: read when it exists, else written")
    args = p.parse_args()
    config = bench_config(args.data_dir, profiler="exact", sequential=False, ratio_of="model")
    model, tokenizer = load(args.model)
    folder = Path(args.profile)
    if folder.exists():
        profile = Profile.load(folder)
    else:
        profile = plan_for(config, calibrate(model, tokenizer, config))[1]
        write_profile_folder(folder, profile)
    achieved = {r["ratio"]: r["achieved_ratio"] for r in json.loads((RESULTS / "recovery.json").read_text())
                if r.get("stage") in ("none", "lsq", "bias")}
    recorded, adapter, same = recorded_plans(), get_adapter(model), 0
    for ratio in RATIOS:
        for name in ALLOCATORS:
            plan = plan_for(config, None, profile, adapter=adapter, ratio=ratio, allocator=name)[0]
            kept = ([len(lp.attn.kept) for lp in plan.layers], [len(lp.mlp.kept) for lp in plan.layers])
            ok = recorded.get((name, ratio)) == kept
            same += ok
            print(name, ratio, "same" if ok else f"DIFFERENT {kept} vs {recorded.get((name, ratio))}", flush=True)
            if name == "gap" and ratio in achieved:
                print(f"recovery gap {ratio}: achieved ratio "
                      f"{'same' if achieved[ratio] == plan.summary['achieved_ratio'] else 'DIFFERENT'}", flush=True)
    print(f"{same} of {len(RATIOS) * len(ALLOCATORS)} allocator plans identical to the recorded ones")
    sys.exit(0 if same == len(RATIOS) * len(ALLOCATORS) else 1)


if __name__ == "__main__":
    main()
