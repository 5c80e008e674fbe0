"""The runtime contract: a cost table per model (measured once per machine and settings, cached), a dense
reference taken before pruning, and a measurement of the pruned model against it."""

from __future__ import annotations

import tempfile
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from gapprune.budget import RuntimeBudget
from gapprune.budgets.microbench import BenchSettings, cost_key, load_or_measure
from gapprune.budgets.table import ModelDims, RuntimeCosts
from gapprune.registry import Registry


@dataclass(frozen=True)
class Verification:
    """A budget measured in the runtime: the value in the budget's units and how it was obtained."""

    measured: float
    details: dict[str, Any]


class Runtime(ABC):
    """One runtime's costs and measurements, at `settings` (its tensor type and threads)."""

    name: ClassVar[str]
    budgets: ClassVar[tuple[type[RuntimeBudget], ...]]  # the budget kinds it can count and verify
    measures: ClassVar[str]  # what --verify measures, for messages

    def __init__(self, settings: BenchSettings) -> None:
        self.settings = settings

    @classmethod
    @abstractmethod
    def settings_for(cls, tensor_type: str, threads: int) -> BenchSettings:
        """Its settings from the command line's tensor type (`--gguf-type`) and `--runtime-threads`."""

    def check(self, budget: RuntimeBudget, model_spec: str, *, verify: bool, gguf: str | None) -> None:
        """Refuse, before the model loads, a budget or a model this runtime cannot count or verify."""
        if not isinstance(budget, self.budgets):
            kinds = ", ".join(b.flag for b in self.budgets)
            raise ValueError(f"the {self.name} runtime counts {kinds}, not {budget.flag}; pick another --runtime")  # noqa: TRY004  (a usage error, as the CLI reports it)

    def costs(self, model_spec: str, profile_dir: str | None, timed: bool) -> RuntimeCosts:
        """The model's cost table for these settings, cached in the profile folder (or under the cache folder's costs/)
        per machine; `timed` False measures memory formulas only."""
        from transformers import AutoConfig

        from gapprune.budgets.runner import cost_file, default_options
        from gapprune.models.loading import default_cache_dir, resolve_model_source

        folder = Path(profile_dir) if profile_dir else default_cache_dir() / "costs" / Path(model_spec).name
        dims = ModelDims.from_config(AutoConfig.from_pretrained(resolve_model_source(model_spec)))
        key = {**cost_key(model_spec, self.settings, self.name), "timed": timed}
        options = default_options(dims)
        with tempfile.TemporaryDirectory(prefix="gapprune-bench-") as workdir:  # one per run: runs never share
            return load_or_measure(folder / cost_file(self.settings, self.name), key,
                                   lambda: self.measure_costs(model_spec, dims, options, Path(workdir), key, timed))

    @abstractmethod
    def measure_costs(self, model_spec: str, dims: ModelDims, options: dict[str, list[list[int]]], workdir: Path,
                      key: dict[str, Any], timed: bool) -> RuntimeCosts:
        """Microbenchmark (or, untimed, compute) the cost of every option."""

    @abstractmethod
    def dense_reference(self, model: Any, tokenizer: Any, model_spec: str, gguf: str | None,
                        workdir: Path) -> Path:
        """The dense model as the runtime runs it, taken before pruning, for a speedup to be measured against."""

    @abstractmethod
    def measure_speedup(self, reference: Path, folder: Path, gguf: str | None) -> Verification:
        """Decode speedup of the pruned model (its `folder`, or the exported `gguf`) over `reference`."""

    def measure_memory(self, context: int, folder: Path, gguf: str | None) -> Verification:
        """Bytes the pruned model holds with a KV cache of `context` tokens."""
        raise ValueError(f"{self.name} does not measure memory; verify a --max-memory budget in another runtime")


RUNTIMES: Registry[type[Runtime]] = Registry("runtime")
