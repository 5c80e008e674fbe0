"""Plans that shard over N tensor-parallel ranks: only options whose kept counts divide by N.

vLLM splits every layer's query heads, KV heads and MLP channels evenly over its ranks (KV heads fewer
than the ranks are replicated, so those must divide N instead). A plan for `--tp N` must keep such
counts in every layer; the DP gets the same loss table with every other option priced out of reach.
"""

from __future__ import annotations

import copy

import numpy as np

from gapprune.allocate.table import LossTable

PRICED_OUT = 1e12  # a ΔL no real option reaches: the DP takes it only when nothing else meets the budget


def shardable(component: str, option: list[int], n: int) -> bool:
    """Whether a layer keeping `option` splits over `n` ranks ((g KV groups, q heads each) or [channels])."""
    if component == "attn":
        groups, per_group = option
        if groups == 0:
            return True  # a removed attention has nothing to split
        kv_ok = groups % n == 0 if groups >= n else n % groups == 0
        return kv_ok and (groups * per_group) % n == 0
    return option[0] % n == 0


def shardable_table(table: LossTable, n: int) -> LossTable:
    """A copy of `table` in which every option that does not split over `n` ranks costs `PRICED_OUT`."""
    if n == 1:
        return table
    restricted = copy.copy(table)
    restricted.loss = {c: v.copy() for c, v in table.loss.items()}
    for component, options in table.options.items():
        for k, option in enumerate(options):
            if not shardable(component, option, n):
                restricted.loss[component][:, k] = PRICED_OUT
    return restricted


def check_sharded(choice: dict[str, list[int]], table: LossTable, n: int) -> None:
    """Refuse a solve that had to take an option that does not split (the budget needs more than the
    shardable options give)."""
    bad = [(c, layer) for c, picks in choice.items() for layer, k in enumerate(picks)
           if not shardable(c, table.options[c][k], n)]
    if bad:
        raise ValueError(f"the budget cannot be met with every layer divisible over {n} tensor-parallel ranks "
                         f"({len(bad)} components would need an option that is not, e.g. {bad[0][0]} of layer "
                         f"{bad[0][1]}); lower the budget or --tp")


def shardable_mask(table: LossTable, n: int) -> dict[str, np.ndarray]:
    """(n_options,) bool per component: which options split over `n` ranks."""
    return {c: np.array([shardable(c, o, n) for o in opts]) for c, opts in table.options.items()}
