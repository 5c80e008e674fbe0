"""The `gapprune prune` side of budgets: flags, the plan for a budget, and `--verify` in the runtime.

`--speedup 2.0` or `--max-memory 250MB --context 4096` replace `--ratio`: one `RuntimeBudget`, solved by
the same `plan_for` as a ratio (the auto profiler completes its table for this budget), with the cost
table of `--runtime` (a `gapprune.runtimes` class; measured once per machine, model and settings, cached in
the profile folder or under $GAPPRUNE_CACHE/costs). With `--verify`, the runtime keeps a dense reference
before pruning and measures the pruned model after (llama.cpp: the `--gguf` file; vLLM: the folder): the
report says predicted against measured and whether the budget was met.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the budget kinds import numpy and the allocators: not for `gapprune --help`
    from gapprune.budget import RuntimeBudget
    from gapprune.budgets.table import RuntimeCosts
    from gapprune.runtimes import Runtime

RUNTIME_NAMES = ("llama.cpp", "vllm")  # gapprune.runtimes.RUNTIMES, named here so --help imports no runtime


def add_budget_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--speedup", type=float, default=None,
                   help="decode speedup at batch 1 in --runtime (e.g. 2.0), instead of --ratio")
    p.add_argument("--max-memory", default=None, help="weights + KV cache in --runtime at --context (e.g. 250MB)")
    p.add_argument("--context", type=int, default=4096, help="context tokens the KV cache holds, for --max-memory")
    p.add_argument("--runtime", choices=RUNTIME_NAMES, default="llama.cpp", help="runtime whose costs the budget is in")
    p.add_argument("--runtime-threads", type=int, default=1, help="threads the runtime is timed with")
    p.add_argument("--verify", action="store_true",
                   help="measure the budget in the runtime after pruning (llama.cpp: the --gguf file; vllm: the folder)")


def runtime_from_args(args: argparse.Namespace) -> Runtime:
    """`--runtime` at the settings `--gguf-type` and `--runtime-threads` give it."""
    from gapprune.runtimes import RUNTIMES

    kind = RUNTIMES.get(args.runtime)
    return kind(kind.settings_for(args.gguf_type, args.runtime_threads))


def budget_from_args(args: argparse.Namespace) -> RuntimeBudget | None:
    """The runtime budget the flags ask for, checked against the runtime before any model loads."""
    from gapprune.budget import MemoryBudget, SpeedupBudget, parse_size

    if args.speedup is not None and args.max_memory is not None:
        raise ValueError("pass --speedup or --max-memory, not both")
    budget: RuntimeBudget | None = None
    if args.speedup is not None:
        budget = SpeedupBudget(args.speedup)
    elif args.max_memory is not None:
        budget = MemoryBudget(parse_size(args.max_memory), args.context)
    if budget is None:
        if args.verify:
            raise ValueError("--verify measures a --speedup or --max-memory budget; pass one of them")
        return None
    runtime_from_args(args).check(budget, args.model, verify=args.verify, gguf=args.gguf)
    return budget


@dataclass
class BudgetHook:
    """What the budget run keeps between its set-up (costs, the dense reference) and verification."""

    budget: RuntimeBudget
    runtime: Runtime
    costs: RuntimeCosts
    reference: Path | None = None
    workdir: Any = None  # a TemporaryDirectory holding a reference the runtime wrote
    plan_summary: dict[str, Any] = field(default_factory=dict)  # the solved plan's, set after pruning


def budget_setup(model: Any, tokenizer: Any, args: argparse.Namespace, budget: RuntimeBudget) -> BudgetHook:
    """The runtime's cost table for the budget, and (to verify a speedup) the dense reference, before pruning.

    Under torchrun rank 0 alone measures and the others take its table: microbenchmarks timed on
    shared cores at once would skew each other, and ranks with different tables would plan (and
    split the auto profiler's rounds) differently."""
    from gapprune.distributed import all_gather, is_main

    runtime = runtime_from_args(args)
    costs = runtime.costs(args.model, args.profile, timed=budget.timed) if is_main() else None
    hook = BudgetHook(budget, runtime, all_gather(costs)[0])
    budget.check_reachable(hook.costs)  # an impossible budget: before the reference and the profile
    if args.verify and budget.needs_reference and is_main():
        hook.workdir = tempfile.TemporaryDirectory(prefix="gapprune-reference-")
        hook.reference = runtime.dense_reference(model, tokenizer, args.model, args.gguf, Path(hook.workdir.name))
    return hook


def finish(hook: BudgetHook, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Plot where time and memory go, verify in the runtime when asked, write budget.json, print the verdict."""
    from gapprune.budgets.plot import plot_costs

    budget, summary = hook.budget, hook.plan_summary
    record: dict[str, Any] = {"budget": budget.kind, "target": budget.target,
                              "predicted": summary["allocation_info"]["predicted"],
                              "gguf_type": hook.runtime.settings.file_type, "context": budget.context or None,
                              "runtime": hook.runtime.name, "threads": hook.runtime.settings.threads,
                              "profiler": summary.get("profiler"), "chosen_exact": summary.get("chosen_exact")}
    try:
        plot_costs(hook.costs, summary["choice"], out / "cost_per_layer.png", budget.context or args.context,
                   f"{budget.kind} {budget.describe()}")
    except ImportError:
        pass
    if args.verify:
        try:
            got = budget.measure(hook.runtime, hook.reference, out, args.gguf)
        finally:
            if hook.workdir is not None:
                hook.workdir.cleanup()
        record.update(measured=got.measured, met=budget.verified(got.measured), details=got.details)
    (out / "budget.json").write_text(json.dumps(record, indent=1) + "\n")
    with (out / "report.md").open("a") as report:
        report.write(f"\n## Budget\n\n{verdict(record, budget)}\n\n![time and memory per layer](cost_per_layer.png)\n")
    print(verdict(record, budget))
    return record


def verdict(record: dict[str, Any], budget: RuntimeBudget) -> str:
    line = f"{budget.kind} budget {budget.describe()}: predicted {budget.describe(record['predicted'])}"
    if "measured" not in record:
        return line + " (not measured; pass --verify)"
    met = "met" if record["met"] else "MISSED"
    off = budget.off_target(record["measured"])
    return f"{line}, measured {budget.describe(record['measured'])} in {record['runtime']} ({off}): {met}"
