"""llama.cpp: costs from microbenchmarks of synthetic GGUFs (`budgets/microbench.py`) and memory formulas
(`budgets/memory.py`); a budget is verified on the exported GGUF (`--gguf`) against the dense GGUF."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from gapprune.budget import MemoryBudget, RuntimeBudget, SpeedupBudget
from gapprune.budgets.microbench import BenchSettings
from gapprune.budgets.table import ModelDims, RuntimeCosts
from gapprune.runtimes.base import RUNTIMES, Runtime, Verification

SPEED_CHECK = {"prompt_tokens": 32, "new_tokens": 64, "repeats": 5, "pairs": 2}


@RUNTIMES.register("llama.cpp")
class LlamaCpp(Runtime):
    name: ClassVar[str] = "llama.cpp"
    budgets: ClassVar[tuple[type[RuntimeBudget], ...]] = (SpeedupBudget, MemoryBudget)
    measures: ClassVar[str] = "the exported GGUF (--gguf)"

    @classmethod
    def settings_for(cls, tensor_type: str, threads: int) -> BenchSettings:
        return BenchSettings(file_type=tensor_type, threads=threads)

    def check(self, budget: RuntimeBudget, model_spec: str, *, verify: bool, gguf: str | None) -> None:
        super().check(budget, model_spec, verify=verify, gguf=gguf)
        if verify and not gguf:
            raise ValueError("--verify measures the exported model in llama.cpp: pass --gguf FILE.gguf too")
        if budget.timed:
            from gapprune.models.loading import ALIASES

            if model_spec not in ALIASES and not str(model_spec).endswith(".gguf"):
                raise ValueError(f"{budget.flag} times llama.cpp on synthetic GGUF files that take their tokenizer "
                                 f"from the model's GGUF, and {model_spec} is not one: export it first (gapprune "
                                 f"export {model_spec} --gguf model.gguf) and prune model.gguf, or use --max-memory")

    def measure_costs(self, model_spec: str, dims: ModelDims, options: dict[str, list[list[int]]], workdir: Path,
                      key: dict[str, Any], timed: bool) -> RuntimeCosts:
        from gapprune.budgets.runner import measure_costs
        from gapprune.models.loading import ALIASES, resolve_alias

        tokenizer_gguf = resolve_alias(model_spec) if model_spec in ALIASES else Path(model_spec)
        return measure_costs(dims, options, tokenizer_gguf, self.settings, workdir, key, timed)

    def dense_reference(self, model: Any, tokenizer: Any, model_spec: str, gguf: str | None,
                        workdir: Path) -> Path:
        from gapprune.export.gguf import export_gguf

        assert gguf is not None  # check() asked for it
        dense = Path(gguf).with_suffix(".dense.gguf")
        export_gguf(model, tokenizer, dense, file_type=self.settings.file_type, overwrite=True)
        return dense

    def measure_speedup(self, reference: Path, folder: Path, gguf: str | None) -> Verification:
        from gapprune.budgets.runner import speed_ratio

        assert gguf is not None
        got = speed_ratio(reference, Path(gguf), self.settings, SPEED_CHECK)
        reference.unlink(missing_ok=True)
        return Verification(got["speedup"], got)

    def measure_memory(self, context: int, folder: Path, gguf: str | None) -> Verification:
        from gapprune.budgets.measure import llamacpp_memory

        assert gguf is not None
        allocated = llamacpp_memory(gguf, context)
        return Verification(allocated.total_bytes, {"model_bytes": allocated.model_bytes,
                                                    "kv_bytes": allocated.kv_bytes})
