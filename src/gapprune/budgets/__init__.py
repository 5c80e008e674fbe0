"""Budgets users deploy against: decode speed and memory in a target runtime, not parameter counts.

A `RuntimeCosts` table gives, for every option of every component of every layer, its decode time
(and prompt time per token) in llama.cpp at one GGUF type and thread count, measured on this machine
by microbenchmarks of synthetic GGUFs (`microbench.py`), and its memory: weights at that type plus
KV-cache bytes per token of context (`memory.py`). `budget.py` turns "1.5x faster" or "250 MB at
4,096 tokens" into "remove at least X" in those units and hands it to the same exact knapsack as
`--ratio` (`allocate/cost_budget.py`).

To add a runtime: write its measurement in a module here that returns a `RuntimeCosts`, and add
its name to `RUNTIMES` in `microbench.py`.
"""

from gapprune.budgets.table import ModelDims, RuntimeCosts

__all__ = ["ModelDims", "RuntimeCosts"]
