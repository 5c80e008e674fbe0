"""Collect `gapprune eval` / `gapprune bench` outputs into docs/results/eval.json and bench.json.

Each record gains the model's pruning ratio (from the folder's plan.json; 0 for the dense model),
the command that produced it, date and machine. The measurements themselves come from:

    gapprune eval MODEL --ppl "" --tasks boolq,piqa,hellaswag,winogrande,arc_easy,arc_challenge,openbookqa \
        --limit 500 --data-dir ../shared/data --out runs/eval500_NAME.json
    gapprune bench runs/gap25_lsq --vs smollm2-135m --repeats 5 --out runs/bench_gap25.json

    python benchmarks/collect_eval.py --eval runs/eval500_*.json --bench runs/bench_*.json --date 2026-11-29
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import machine


def ratio_of(model: str) -> float:
    plan = Path(model) / "plan.json"
    if not plan.is_file():
        return 0.0
    return float(json.loads(plan.read_text())["summary"]["achieved_ratio"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eval", nargs="*", default=[])
    parser.add_argument("--bench", nargs="*", default=[])
    parser.add_argument("--date", required=True, help="the date the measurements were taken")
    parser.add_argument("--out-dir", default="docs/results")
    args = parser.parse_args()
    meta = {"date": args.date, "machine": machine()}
    evals = []
    for path in args.eval:
        for r in json.loads(Path(path).read_text()):
            command = (f"gapprune eval {r['model']} --ppl '' --tasks <7 tasks> --limit {r['limit']} "
                       "--data-dir ../shared/data")
            evals.append({"model": r["model"], "ratio": round(ratio_of(r["model"]), 4), "task": r["task"],
                          "metric": r["metric"], "value": r["value"], "stderr": r.get("stderr"), "limit": r["limit"],
                          "command": command, **meta})
    benches = []
    for path in args.bench:
        records = json.loads(Path(path).read_text())
        pruned = records[0]["model"]
        dense = next(r["model"] for r in records if r["model"] != pruned)
        for r in records:
            benches.append({**r, "ratio": round(ratio_of(r["model"]), 4),
                            "command": f"gapprune bench {pruned} --vs {dense} --repeats 5", **meta})
    out = Path(args.out_dir)
    if evals:
        (out / "eval.json").write_text(json.dumps(evals, indent=1) + "\n")
    if benches:
        (out / "bench.json").write_text(json.dumps(benches, indent=1) + "\n")


if __name__ == "__main__":
    main()
