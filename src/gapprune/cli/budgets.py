"""The `gapprune prune` side of budgets: flags, the plan for a budget, and `--verify` in llama.cpp.

`--speedup 2.0` or `--max-memory 250MB --context 4096` replace `--ratio`: one `Budget`, solved by the
same `plan_for` as a ratio (the auto profiler completes its table for this budget), with the cost
table of `--runtime` at `--gguf-type` (measured once per machine, model and type, cached in the
profile folder or under $GAPPRUNE_CACHE/costs). With `--verify`, the dense
model is exported before pruning and the pruned GGUF after, and both are measured in llama.cpp:
the report says predicted against measured and whether the budget was met.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gapprune.budget import Budget
from gapprune.budgets.budget import check_reachable, parse_size
from gapprune.budgets.microbench import RUNTIMES, BenchSettings
from gapprune.budgets.table import RuntimeCosts


def add_budget_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--speedup", type=float, default=None,
                   help="decode speedup at batch 1 in --runtime (e.g. 2.0), instead of --ratio")
    p.add_argument("--max-memory", default=None, help="weights + KV cache in --runtime at --context (e.g. 250MB)")
    p.add_argument("--context", type=int, default=4096, help="context tokens the KV cache holds, for --max-memory")
    p.add_argument("--runtime", choices=RUNTIMES, default="llama.cpp", help="runtime whose costs the budget is in")
    p.add_argument("--runtime-threads", type=int, default=1, help="threads the runtime is timed with")
    p.add_argument("--verify", action="store_true",
                   help="export dense and pruned GGUFs and measure the budget in the runtime (needs --gguf)")


def budget_from_args(args: argparse.Namespace) -> Budget | None:
    if args.speedup is not None and args.max_memory is not None:
        raise ValueError("pass --speedup or --max-memory, not both")
    if args.verify and not args.gguf and (args.speedup is not None or args.max_memory is not None):
        raise ValueError("--verify measures the exported model in the runtime: pass --gguf FILE.gguf too")
    if args.speedup is not None:
        from gapprune.models.loading import ALIASES

        if args.model not in ALIASES and not str(args.model).endswith(".gguf"):
            raise ValueError(f"--speedup times llama.cpp on synthetic GGUF files that take their tokenizer from the "
                             f"model's GGUF, and {args.model} is not one: export it first "
                             f"(gapprune export {args.model} --gguf model.gguf) and prune model.gguf, or use --max-memory")
        return Budget("speedup", args.speedup)
    if args.max_memory is not None:
        return Budget("memory", parse_size(args.max_memory), args.context)
    if args.verify:
        raise ValueError("--verify measures a --speedup or --max-memory budget; pass one of them")
    return None


@dataclass
class BudgetHook:
    """What the budget run keeps between its set-up (costs, the dense GGUF) and verification."""

    budget: Budget
    settings: BenchSettings
    costs: RuntimeCosts
    dense_gguf: Path | None = None
    plan_summary: dict[str, Any] = field(default_factory=dict)  # the solved plan's, set after pruning


def costs_for(model_spec: str, profile_dir: str | None, settings: BenchSettings, timed: bool) -> RuntimeCosts:
    from gapprune.budgets.runner import cost_table

    cache = Path(os.environ.get("GAPPRUNE_CACHE", Path.home() / ".cache" / "gapprune")) / "costs"
    folder = Path(profile_dir) if profile_dir else cache / Path(model_spec).name
    with tempfile.TemporaryDirectory(prefix="gapprune-bench-") as workdir:  # one per run: runs at once never share
        return cost_table(model_spec, folder, settings, Path(workdir), time=timed)


def budget_setup(model: Any, tokenizer: Any, args: argparse.Namespace, budget: Budget) -> BudgetHook:
    """The runtime's cost table for the budget, and (to verify a speedup) the dense GGUF, before pruning.

    Under torchrun rank 0 alone measures and the others take its table: microbenchmarks timed on
    shared cores at once would skew each other, and ranks with different tables would plan (and
    split the auto profiler's rounds) differently."""
    from gapprune.distributed import all_gather, is_main

    settings = BenchSettings(file_type=args.gguf_type, threads=args.runtime_threads)
    costs = costs_for(args.model, args.profile, settings, timed=budget.kind == "speedup") if is_main() else None
    hook = BudgetHook(budget, settings, all_gather(costs)[0])
    check_reachable(budget, hook.costs)  # an impossible budget: before the dense export and the profile
    if args.verify and budget.kind == "speedup" and is_main():
        from gapprune.export.gguf import export_gguf

        hook.dense_gguf = Path(args.gguf).with_suffix(".dense.gguf")
        export_gguf(model, tokenizer, hook.dense_gguf, file_type=args.gguf_type, overwrite=True)
    return hook


def finish(hook: BudgetHook, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Plot where time and memory go, verify in the runtime when asked, write budget.json, print the verdict."""
    from gapprune.budgets.plot import plot_costs

    budget, summary = hook.budget, hook.plan_summary
    record: dict[str, Any] = {"budget": budget.kind, "target": budget.target,
                              "predicted": summary["allocation_info"]["predicted"],
                              "gguf_type": hook.settings.file_type, "context": budget.context or None,
                              "runtime": args.runtime, "threads": hook.settings.threads,
                              "profiler": summary.get("profiler"), "chosen_exact": summary.get("chosen_exact")}
    try:
        plot_costs(hook.costs, summary["choice"], out / "cost_per_layer.png", budget.context or args.context,
                   f"{budget.kind} {budget.describe(budget.target)}")
    except ImportError:
        pass
    if args.verify:
        from gapprune.budgets.measure import llamacpp_memory
        from gapprune.budgets.runner import speed_ratio

        if budget.kind == "speedup":
            assert hook.dense_gguf is not None
            got = speed_ratio(hook.dense_gguf, Path(args.gguf), hook.settings,
                              {"prompt_tokens": 32, "new_tokens": 64, "repeats": 5, "pairs": 2})
            hook.dense_gguf.unlink(missing_ok=True)
            record.update(measured=got["speedup"], details=got, met=got["speedup"] >= budget.target * 0.95)
        else:
            allocated = llamacpp_memory(args.gguf, budget.context)
            record.update(measured=allocated.total_bytes, met=allocated.total_bytes <= budget.target,
                          details={"model_bytes": allocated.model_bytes, "kv_bytes": allocated.kv_bytes})
    (out / "budget.json").write_text(json.dumps(record, indent=1) + "\n")
    with (out / "report.md").open("a") as report:
        report.write(f"\n## Budget\n\n{verdict(record, budget)}\n\n![time and memory per layer](cost_per_layer.png)\n")
    print(verdict(record, budget))
    return record


def verdict(record: dict[str, Any], budget: Budget) -> str:
    line = f"{budget.kind} budget {budget.describe(budget.target)}: predicted {budget.describe(record['predicted'])}"
    if "measured" not in record:
        return line + " (not measured; pass --verify)"
    met = "met" if record["met"] else "MISSED"
    off = f"{100 * (record['measured'] / budget.target - 1):+.1f}% of the target"
    if budget.kind == "memory":  # a miss of a few hundred bytes would read "+0.0%"
        off += f", {record['measured'] - budget.target:+,.0f} bytes"
    return f"{line}, measured {budget.describe(record['measured'])} in {record['runtime']} ({off}): {met}"
