"""Speed and memory budgets for SmolLM2-135M in llama.cpp (one thread), predicted against measured.

    python benchmarks/budgets.py costs     # microbenchmark the cost table (cached in the profile folder)
    python benchmarks/budgets.py plans     # speedup 1.5x, 2.0x and memory plans vs parameter plans
    python benchmarks/budgets.py speedup:2 # (or speedup, memory) some targets only, e.g. one process each
    python benchmarks/budgets.py cli       # the CLI's speed budget as a user runs it (defaults, auto profiler)

Records go to docs/results/budgets.json. The profile folder is `gapprune profile smollm2-135m --out
runs/budgets/profile` (default settings); every plan below reads its loss table.
"""

from __future__ import annotations

import json
import logging
import shlex
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from budget_run import BudgetRun
from common import GAPPRUNE, machine

from gapprune.budget import Budget
from gapprune.budgets.budget import parse_size
from gapprune.budgets.microbench import BenchSettings
from gapprune.budgets.runner import cost_table

MODEL, PROFILE, WORK = "smollm2-135m", Path("runs/budgets/profile"), Path("runs/budgets")
SETTINGS = BenchSettings(file_type="q8_0", threads=1, prompt_tokens=32, new_tokens=32, repeats=3)
MEMORY_TYPE, CONTEXT = "f16", 4096
TARGETS = [Budget("speedup", 1.5), Budget("speedup", 2.0), Budget("memory", parse_size("250MB"), CONTEXT)]
VERIFY = {"prompt_tokens": 32, "new_tokens": 64, "repeats": 5, "pairs": 2}  # dense and pruned back to back
RECORDS = Path("docs/results/budgets.json")
# The profile is the repository's SmolLM2 benchmark profile (exact table): calibrate as it was measured.
CALIBRATION = {"criterion": "activation", "metric": "kl", "calib": "wikitext2", "calib_split": "validation",
               "calib_samples": 32, "profile_samples": 4, "seq_len": 128, "batch_size": 4, "mlp_stride": 4,
               "profiler": "exact", "compensate": "none"}  # no compensation: the allocations alone are compared


CLI = "prune smollm2-135m --speedup 1.5 --runtime llama.cpp --gguf-type q8_0 --verify --overwrite --no-plots"


def cli_budget() -> None:
    """`gapprune prune ... --speedup 1.5 --verify` with every other setting the CLI's default: one record of
    what the run met and whether every entry the DP chose was measured exactly."""
    with tempfile.TemporaryDirectory(prefix="gapprune-cli-budget-") as folder:
        out, gguf = Path(folder) / "pruned", Path(folder) / "pruned.gguf"
        start = time.perf_counter()
        subprocess.run([GAPPRUNE, *shlex.split(CLI), "--gguf", str(gguf),
                        "--out", str(out)], check=True)
        wall = time.perf_counter() - start
        budget = json.loads((out / "budget.json").read_text())
        plan = json.loads((out / "plan.json").read_text())
    chosen = budget["chosen_exact"]
    records = json.loads(RECORDS.read_text()) if RECORDS.exists() else []
    records.append({"kind": "cli_budget", "profiler": budget["profiler"], "budget": budget["budget"],
                    "target": budget["target"], "predicted": budget["predicted"], "measured": budget["measured"],
                    "error": round(budget["measured"] / budget["target"] - 1, 4), "met": budget["met"],
                    "exact_chosen": chosen["exact"] == chosen["chosen"], "chosen_exact": chosen,
                    "params_removed": plan["summary"]["params_removed"], "wall_s": round(wall, 1),
                    "details": budget.get("details"), "threads": budget["threads"], "date": date.today().isoformat(),
                    "machine": machine(), "command": f"gapprune {CLI} --gguf F --out D (GAPPRUNE_DATA=../shared/data)"})
    RECORDS.write_text(json.dumps(records, indent=1) + "\n")


def main(stage: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if stage == "cli":
        cli_budget()
        return
    if stage == "costs":
        for settings in (SETTINGS, BenchSettings(file_type=MEMORY_TYPE, threads=1, repeats=1)):
            costs = cost_table(MODEL, WORK / "costs", settings, WORK / "bench", time=settings is SETTINGS)
            print(json.dumps(costs.fit.get("checks", {}), indent=1))
            print(json.dumps(costs.fit.get("mlp_held_out", {}), indent=1))
        return
    # plans | speedup | memory | speedup:2.0 (one target, e.g. one process each)
    targets = [t for t in TARGETS if stage in ("plans", t.kind, f"{t.kind}:{t.target:g}")]
    types = tuple({SETTINGS.file_type if t.kind == "speedup" else MEMORY_TYPE for t in targets})
    if stage == "merge":  # the records from `one` runs: each budget's plan with its parameter plan
        sides = {p.stem: json.loads(p.read_text()) for p in sorted(WORK.glob("one-*.json"))}
        records = [merge(ours, sides.get(name.replace("-ours", "-param"))) for name, ours in sides.items()
                   if name.endswith("-ours")]
        RECORDS.write_text(json.dumps(records, indent=1) + "\n")
        return
    run = BudgetRun(MODEL, PROFILE, WORK, verify=VERIFY, prepare=types, wait_s=3600, costs_dir=WORK / "costs",
                    settings=CALIBRATION)
    if len(sys.argv) > 2:  # one side of one target: budgets.py speedup:2 ours|param
        settings = SETTINGS if targets[0].kind == "speedup" else BenchSettings(file_type=MEMORY_TYPE, repeats=1)
        side = run.one(targets[0], settings, sys.argv[2])
        out = WORK / f"one-{targets[0].kind}-{targets[0].target:g}-{sys.argv[2]}.json"
        out.write_text(json.dumps({**side, "verify": VERIFY, "threads": settings.threads}, indent=1) + "\n")
        return
    for budget in targets:
        records = json.loads(RECORDS.read_text()) if RECORDS.exists() else []
        settings = SETTINGS if budget.kind == "speedup" else BenchSettings(file_type=MEMORY_TYPE, threads=1, repeats=1)
        if any(r["budget"] == budget.kind and r["target"] == budget.target for r in records):
            continue
        records.append(run.compare(budget, settings))
        RECORDS.parent.mkdir(parents=True, exist_ok=True)
        RECORDS.write_text(json.dumps(records, indent=1) + "\n")


def merge(ours: dict, param: dict | None) -> dict:
    """One record: the budget plan's numbers, and the parameter plan's beside them."""
    record = {k: ours[k] for k in ("budget", "target", "predicted", "measured", "gguf_type", "context", "ppl")}
    record["ppl_param_plan"] = param["ppl"] if param else None
    record["error"] = ours["measured"] / ours["target"] - 1
    record["met"] = abs(record["error"]) <= 0.05 if ours["budget"] == "speedup" else ours["measured"] <= ours["target"]
    record["param_plan"] = {k: param[k] for k in ("ratio", "predicted", "measured", "details", "params_removed",
                                                  "predicted_loss")} if param else None
    record.update(details=ours["details"], params_removed=ours["params_removed"], predicted_loss=ours["predicted_loss"],
                  verify=ours["verify"], threads=ours["threads"], runtime="llama.cpp (cyllama), CPU time",
                  compensate="none")
    return record


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "plans")
