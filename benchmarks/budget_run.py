"""The budget study's harness: one loaded dense model and its profile, plans for runtime budgets and
for the ratios that match them, made real (pruned, exported) and measured in llama.cpp.

A benchmark, not the product: `gapprune prune --speedup/--max-memory` solves its budget with
`pipeline.plan_for`; here given allocations are materialised side by side to compare them.
"""

from __future__ import annotations

import logging
import shutil
import time as _time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gapprune.allocate import Allocation
from gapprune.budget import Budget
from gapprune.budgets.budget import achieved, allocate_budget
from gapprune.budgets.measure import llamacpp_memory
from gapprune.budgets.microbench import BenchSettings
from gapprune.budgets.runner import cost_table, speed_ratio
from gapprune.budgets.table import RuntimeCosts

log = logging.getLogger(__name__)


@dataclass
class Measured:
    """One plan, materialised: where its GGUF is and what it measured."""

    name: str
    allocation: Allocation
    gguf: Path
    ppl: float
    extra: dict[str, Any] = field(default_factory=dict)


class BudgetRun:
    """One loaded dense model and its profile: plans for budgets and for ratios, made real and measured.

    Both kinds of plan read the same loss table and are compensated the same way (the config's
    default, sequential lsq), so they differ only in how the allocation spent the budget.
    """

    def __init__(self, model: str, profile: str | Path, workdir: str | Path, verify: dict[str, int],
                 eval_windows: int = 256, data_dir: str | None = None, prepare: tuple[str, ...] = (),
                 wait_s: float = 0.0, costs_dir: str | Path | None = None,
                 settings: dict[str, Any] | None = None) -> None:
        import os

        from gapprune.api import load, require_tokenizer
        from gapprune.config import PruneConfig
        from gapprune.pipeline import Profile, calibrate

        self.model_name, self.workdir, self.verify, self.eval_windows = model, Path(workdir), verify, eval_windows
        self.data_dir = data_dir or os.environ.get("GAPPRUNE_DATA")
        self.model, tokenizer = load(model)
        self.tokenizer = require_tokenizer(tokenizer, model, "budgets calibrate and evaluate on text")
        self.config = PruneConfig(**{"ratio": 0.5, "data_dir": self.data_dir, **(settings or {})})
        # compensate "none" needs no calibration pass (plans are then compared as the allocator tables are)
        self.calibration = calibrate(self.model, self.tokenizer, self.config) if self.config.compensate != "none" \
            else None
        self.dense_ggufs: dict[str, Path] = {}
        for file_type in prepare:  # dense GGUFs while a profile may still be measured elsewhere
            self.dense_gguf(file_type)
        self.profile_dir = Path(profile)
        deadline = _time.monotonic() + wait_s
        while not (self.profile_dir / "loss_table.json").is_file() and _time.monotonic() < deadline:
            _time.sleep(20)
        self.profile = Profile.load(profile)
        try:
            if self.calibration is not None:
                self.profile.check_matches(self.calibration, self.config)
        except ValueError as err:  # e.g. a profile measured by an older checkout of the same settings
            log.warning("profile check: %s; using it anyway (same model and default settings)", err)
        for table in Path(costs_dir or profile).glob("runtime_costs-*.json"):  # measured before the profile was
            if not (self.profile_dir / table.name).exists():
                shutil.copy(table, self.profile_dir / table.name)

    def costs(self, settings: BenchSettings, time: bool = True) -> RuntimeCosts:
        return cost_table(self.model_name, self.profile_dir, settings, self.workdir / "bench", time)

    def ratio_allocation(self, ratio: float) -> Allocation:
        from gapprune.pipeline import allocate

        return allocate(self.profile, ratio, "gap")

    def matching_ratio(self, costs: RuntimeCosts, budget: Budget, value: float) -> float:
        """The parameter ratio whose GAP plan has the predicted speedup (or bytes) `value`: bisection."""
        lo, hi = 0.01, 0.6
        for _ in range(30):
            mid = (lo + hi) / 2
            got = achieved(budget, costs, self.ratio_allocation(mid).choice)
            too_little = got < value if budget.kind == "speedup" else got > value
            lo, hi = (mid, hi) if too_little else (lo, mid)
        return (lo + hi) / 2

    def dense_gguf(self, file_type: str) -> Path:
        from gapprune.export.gguf import export_gguf

        if file_type not in self.dense_ggufs:
            path = self.workdir / f"dense-{file_type}.gguf"
            if not path.exists():
                export_gguf(self.model, self.tokenizer, path, file_type=file_type)
            self.dense_ggufs[file_type] = path
        return self.dense_ggufs[file_type]

    def materialise(self, name: str, allocation: Allocation, file_type: str) -> Measured:
        """Prune a copy by the allocation (with the config's compensation), export its GGUF, score it."""
        from gapprune.api import pruned_copy
        from gapprune.evaluate.perplexity import evaluate_ppl
        from gapprune.export.gguf import export_gguf
        from gapprune.models import get_adapter
        from gapprune.pipeline import plan_from_allocation

        plan = plan_from_allocation(get_adapter(self.model), self.profile, allocation, self.config.to_dict())
        cal = self.calibration
        sequential = cal.inputs if cal is not None and self.config.sequential else None
        pruned, _ = pruned_copy(self.model, plan, self.config.compensate, cal.gram if cal is not None else None,
                                self.config.ridge, sequential)
        path = self.workdir / f"{name}.gguf"
        export_gguf(pruned, self.tokenizer, path, file_type=file_type, overwrite=True)
        ppl = evaluate_ppl(pruned, self.tokenizer, "wikitext2", seq_len=128, max_windows=self.eval_windows,
                           data_dir=self.data_dir, progress=False).ppl
        plan.save(self.workdir / f"{name}.plan.json")
        del pruned
        return Measured(name, allocation, path, ppl, {"params_removed": plan.params_removed})

    def measure(self, budget: Budget, settings: BenchSettings, gguf: Path) -> dict[str, Any]:
        if budget.kind == "speedup":
            return speed_ratio(self.dense_gguf(settings.file_type), gguf, settings, self.verify)
        allocated = llamacpp_memory(gguf, budget.context)
        return {"bytes": allocated.total_bytes, "model_bytes": allocated.model_bytes, "kv_bytes": allocated.kv_bytes,
                "compute_bytes": allocated.compute_bytes}

    def one(self, budget: Budget, settings: BenchSettings, which: str) -> dict[str, Any]:
        """One side of `compare` alone ("ours": the budget's plan; "param": the GAP parameter plan whose
        *predicted* speedup or size matches ours'), so the sides can run as separate processes."""
        costs = self.costs(settings, time=budget.kind == "speedup")
        tag = f"{budget.kind}-{budget.target:g}-{settings.file_type}"
        allocation = allocate_budget(self.profile.table, costs, budget)
        ratio = None
        if which == "param":
            ratio = self.matching_ratio(costs, budget, allocation.info["predicted"])
            allocation, tag = self.ratio_allocation(ratio), f"{tag}-param"
        made = self.materialise(tag, allocation, settings.file_type)
        got = self.measure(budget, settings, made.gguf)
        if which == "ours":
            from gapprune.budgets.plot import plot_costs

            plot_costs(costs, allocation.choice, self.workdir / f"{tag}.costs.png", budget.context or 4096,
                       f"{tag}: time and memory per layer")
        return {"which": which, "budget": budget.kind, "target": budget.target, "gguf_type": settings.file_type,
                "context": budget.context or None, "ratio": ratio, "ppl": made.ppl,
                "predicted": achieved(budget, costs, allocation.choice), "predicted_loss":
                allocation.predicted_loss(self.profile.table), "measured": got["speedup" if budget.kind == "speedup"
                                                                                else "bytes"],
                "details": got, "params_removed": made.extra["params_removed"]}

    def compare(self, budget: Budget, settings: BenchSettings) -> dict[str, Any]:
        """The budget's plan and the parameter plan that matches it (measured speed, or size), both measured."""
        from gapprune.budgets.plot import plot_costs

        costs = self.costs(settings, time=budget.kind == "speedup")
        tag = f"{budget.kind}-{budget.target:g}-{settings.file_type}"
        allocation = allocate_budget(self.profile.table, costs, budget)
        ours = self.materialise(tag, allocation, settings.file_type)
        got = self.measure(budget, settings, ours.gguf)
        value = got["speedup"] if budget.kind == "speedup" else got["bytes"]
        plot_costs(costs, allocation.choice, self.workdir / f"{tag}.costs.png", budget.context or 4096,
                   f"{tag}: time and memory per layer")
        # the parameter plan whose measured value matches ours: predicted first, then one measured correction
        predicted_value = allocation.info["predicted"]
        ratio = self.matching_ratio(costs, budget, value * (predicted_value / value if budget.kind == "memory" else 1))
        param = self.materialise(f"{tag}-param", self.ratio_allocation(ratio), settings.file_type)
        got_param = self.measure(budget, settings, param.gguf)
        param_value = got_param["speedup"] if budget.kind == "speedup" else got_param["bytes"]
        record = {
            "budget": budget.kind, "target": budget.target, "predicted": predicted_value, "measured": value,
            "gguf_type": settings.file_type, "context": budget.context or None, "ppl": ours.ppl,
            "ppl_param_plan": param.ppl, "param_plan_ratio": round(ratio, 4), "param_plan_measured": param_value,
            "param_plan_predicted": achieved(budget, costs, self.ratio_allocation(ratio).choice),
            "met": value >= budget.target * 0.95 if budget.kind == "speedup" else value <= budget.target,
            "error": value / budget.target - 1, "details": got, "param_details": got_param,
            "params_removed": ours.extra["params_removed"], "param_plan_params_removed": param.extra["params_removed"],
            "verify": self.verify, "threads": settings.threads, "runtime": "llama.cpp (cyllama)",
        }
        log.info("%s", record)
        return record
