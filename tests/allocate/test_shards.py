"""--tp N: GAP's DP keeps only options that split over N ranks, and stays exact among them."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from gapprune.allocate.shards import shardable, shardable_table
from gapprune.allocate.table import LossTable
from gapprune.budget import ParamsBudget, RatioBudget, solver
from gapprune.cli import main
from gapprune.serving.vllm_runtime import check_servable

ATTN = [[2, 2], [2, 1], [1, 2], [1, 1], [0, 0]]  # (KV groups, heads per group) of a 2-group, 2-head layer
MLP = [[12], [9], [6], [3], [0]]
HIDDEN = 4


def random_table(seed: int, n_layers: int = 3) -> LossTable:
    rng = np.random.default_rng(seed)
    heads = np.array([g * q for g, q in ATTN])
    attn_removed = np.tile((4 - heads) * 2 * HIDDEN, (n_layers, 1))
    mlp_removed = np.tile((12 - np.array([w for (w,) in MLP])) * 3 * HIDDEN, (n_layers, 1))
    loss = {c: np.sort(rng.random((n_layers, 5)), axis=1) for c in ("attn", "mlp")}
    for v in loss.values():
        v[:, 0] = 0.0
    return LossTable("kl", "obs", {"attn": ATTN, "mlp": MLP}, loss,
                     {"attn": attn_removed, "mlp": mlp_removed}, param_unit=HIDDEN)


@pytest.mark.parametrize(("component", "option", "n", "ok"), [
    ("attn", [2, 2], 2, True), ("attn", [2, 1], 2, True), ("attn", [1, 2], 2, True),  # 1 KV head: replicated
    ("attn", [1, 1], 2, False), ("attn", [3, 2], 2, False), ("attn", [0, 0], 2, True), ("attn", [4, 1], 4, True),
    ("mlp", [12], 2, True), ("mlp", [9], 2, False), ("mlp", [0], 4, True), ("mlp", [6], 4, False),
])
def test_which_options_split_over_ranks(component, option, n, ok):
    assert shardable(component, option, n) is ok


@pytest.mark.parametrize("seed", range(12))
def test_the_dp_with_tp_equals_brute_force_over_shardable_options(seed):
    table = random_table(seed)
    total = int(sum(v[:, -1].sum() for v in table.removed.values()))
    params = int(np.random.default_rng(100 + seed).integers(1, total // 2))
    allocation = solver(ParamsBudget(params), "gap", 10 * total, 0, tp=2)(table)
    groups = [(c, layer) for layer in range(3) for c in ("attn", "mlp")]
    allowed = {c: [k for k, o in enumerate(table.options[c]) if shardable(c, o, 2)] for c in ("attn", "mlp")}
    best = min(
        sum(table.loss[c][layer, k] for (c, layer), k in zip(groups, combo))
        for combo in itertools.product(*[allowed[c] for c, _ in groups])
        if sum(table.removed[c][layer, k] for (c, layer), k in zip(groups, combo)) >= params
    )
    picks = [allocation.choice[c][layer] for c, layer in groups]
    assert all(shardable(c, table.options[c][k], 2) for (c, _), k in zip(groups, picks))
    assert sum(table.loss[c][layer, k] for (c, layer), k in zip(groups, picks)) == pytest.approx(best)


def test_tp_1_leaves_the_table_as_it_is():
    table = random_table(0)
    assert shardable_table(table, 1) is table


def test_a_budget_only_unshardable_options_meet_is_refused():
    table = random_table(1)
    table.removed["attn"][:] = 0  # only the MLP widths 9 and 3, which do not split in two, remove anything
    table.removed["mlp"][:, [0, 2, 4]] = 0
    with pytest.raises(ValueError, match="divisible over 2 tensor-parallel ranks"):
        solver(ParamsBudget(1), "gap", 10**6, 0, tp=2)(table)


def test_other_allocators_are_refused_with_tp():
    with pytest.raises(ValueError, match="--tp 2"):
        solver(RatioBudget(0.25), "uniform", 1000, 0, tp=2)


def test_a_prune_with_tp_2_saves_a_folder_vllm_can_shard_over_2(tiny_model_folder, tmp_path):
    """Channel steps of 25 offer odd widths (103, 53, 3) and the heads one alone: none may be chosen."""
    folder, text = tiny_model_folder
    out = tmp_path / "out"
    assert main(["prune", str(folder), "--ratio", "0.4", "--out", str(out), "--calib", str(text), "--calib-samples",
                 "4", "--profile-samples", "4", "--seq-len", "32", "--channel-step", "25", "--no-plots",
                 "--tp", "2"]) == 0
    check_servable(out, tensor_parallel=2)
    assert json.loads((out / "plan.json").read_text())["config"]["tp"] == 2
