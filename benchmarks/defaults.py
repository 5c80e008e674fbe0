"""GAP against the four baseline allocators under the current defaults of `gapprune prune`.

Every plan comes from one calibration with the default settings (criterion obs, sequential lsq,
auto profiler, 32 x 128 WikiText-2 validation tokens); only the allocator and the ratio change, and
every pruned copy is compensated as `gapprune prune` would save it. The baselines follow the peers'
allocation rules: uniform (LLM-Pruner, Wanda-sp), global (FLAP), depth (ShortGPT), owl (OWL).

    python benchmarks/defaults.py --data-dir ../shared/data --out docs/results/defaults.json
"""

from __future__ import annotations

from common import ALLOCATORS, DATASETS, ResultLog, Window, parser, perplexity

from gapprune.api import load, pruned_copy
from gapprune.config import PruneConfig
from gapprune.pipeline import calibrate, plan_for

p = parser(__doc__, "docs/results/defaults.json")
p.add_argument("--ratios", default="0.25,0.5")
p.add_argument("--windows", type=int, default=64, help="first windows of 128 tokens of each test split")
args = p.parse_args()
log = ResultLog(args.out)
model, tokenizer = load(args.model)
config = PruneConfig(ratio=0.25, data_dir=args.data_dir)  # every other setting is the default
calibration = calibrate(model, tokenizer, config)
gap_profile = None
for ratio in map(float, args.ratios.split(",")):
    for allocator in ALLOCATORS:
        labels = {"kind": "defaults", "model": args.model, "target_ratio": ratio, "allocator": allocator}
        if all(log.done(**labels, dataset=d) for d in DATASETS):
            continue
        plan, profile = plan_for(config, calibration, gap_profile if allocator == "gap" else None, ratio=ratio,
                                 allocator=allocator)
        gap_profile = profile if allocator == "gap" else gap_profile
        pruned, _ = pruned_copy(model, plan, config.compensate, calibration.gram, config.ridge, calibration.inputs)
        for dataset in DATASETS:
            record = perplexity(pruned, tokenizer, Window(dataset, 128, args.windows), args.data_dir)
            log.emit({**labels, **record, "achieved_ratio": plan.summary["achieved_ratio"],
                      "settings": {k: v for k, v in config.to_dict().items() if k not in ("ratio", "data_dir")}})
