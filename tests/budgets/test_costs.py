"""Cost tables: the shape and sign of a fitted table, the save/load round trip, budgets on top of it."""

from __future__ import annotations

import numpy as np
import pytest

from gapprune.allocate.knapsack import InfeasibleBudget
from gapprune.allocate.table import LossTable
from gapprune.budget import MemoryBudget, RuntimeBudget, SpeedupBudget, parse_size
from gapprune.budgets.microbench import BenchSettings, fit_costs, grid_points
from gapprune.budgets.runner import check_shapes, default_options
from gapprune.budgets.table import ModelDims, RuntimeCosts

DIMS = ModelDims(n_layers=4, hidden=64, head_dim=16, n_heads=4, n_kv_heads=2, intermediate=256, vocab=512, tied=True)


def fake_times(points: dict) -> dict:
    """Times a runtime might give: a fixed part plus a per-head, per-KV-head and per-channel cost."""
    def t(shapes: list, prompt: bool) -> float:
        return (200.0 if not prompt else 30.0) + sum(5 + 3 * h + 2 * kv + 0.04 * w for h, kv, w in shapes)

    out = {name: {"decode_us": t(s, False), "prompt_us": t(s, True)} for name, s in points.items()}
    out["dense"] = {"decode_us": t([(4, 2, 256)] * 4, False), "prompt_us": t([(4, 2, 256)] * 4, True)}
    return out


def fitted(file_type: str = "q8_0") -> RuntimeCosts:
    settings = BenchSettings(file_type=file_type, mlp_grid=4)
    checks = check_shapes(DIMS)
    points, attn, widths, held_out = grid_points(DIMS, settings, checks)
    key = {"runtime": "llama.cpp", "file_type": file_type, "machine": "test"}
    return fit_costs(DIMS, default_options(DIMS, 8), fake_times(points), attn, widths, held_out, checks, key)


def loss_table(costs: RuntimeCosts, seed: int = 0) -> LossTable:
    rng = np.random.default_rng(seed)
    loss = {c: np.hstack([np.zeros((DIMS.n_layers, 1)), rng.uniform(0.01, 1, (DIMS.n_layers, len(o) - 1))])
            for c, o in costs.options.items()}
    removed = {c: np.zeros(v.shape, dtype=np.int64) for c, v in loss.items()}
    return LossTable("kl", "test", costs.options, loss, removed)


def test_fitted_table_has_one_positive_cost_per_option() -> None:
    costs = fitted()
    for kind, per in costs.cost.items():
        for c, values in per.items():
            assert values.shape == (DIMS.n_layers, len(costs.options[c])), (kind, c)
            if (kind, c) != ("kv_bytes_per_cell", "mlp"):  # an MLP holds no KV cache
                assert (values[:, 0] > 0).all(), (kind, c)  # the dense option costs something
            assert (values >= 0).all()
    assert costs.fixed["decode_us"] > 0 and costs.fixed["weight_bytes"] > 0
    # the additive prediction reproduces an additive runtime on the held-out whole-model checks
    for name, check in costs.fit["checks"].items():
        assert check["decode_us"]["predicted"] == pytest.approx(check["decode_us"]["measured"], rel=0.01), name


def test_cost_table_survives_save_and_load(tmp_path) -> None:
    costs = fitted()
    costs.save(tmp_path / "costs.json")
    back = RuntimeCosts.load(tmp_path / "costs.json")
    assert back.key == costs.key and back.dims == costs.dims and back.options == costs.options
    assert back.fixed == costs.fixed
    for kind in costs.cost:
        for c in costs.cost[kind]:
            np.testing.assert_array_equal(back.cost[kind][c], costs.cost[kind][c])
    choice = {c: [1] * DIMS.n_layers for c in costs.options}
    assert back.total("memory_bytes", choice, 4096) == costs.total("memory_bytes", choice, 4096)


def test_memory_counts_weights_and_kv_cache_at_the_context() -> None:
    costs = fitted("f16")
    dense = costs.total("memory_bytes", costs.dense_choice(), 1000)
    # counted by hand, not through `memory`: f16 matrices, f32 norms, one tied 512 x 64 embedding
    attn = 64 * 4 + 2 * (64 * 64 * 2) + 2 * (32 * 64 * 2)  # attn_norm; q and o (4 heads of 16); k and v (2 KV heads)
    mlp = 64 * 4 + 3 * (256 * 64 * 2)  # ffn_norm; gate, up, down
    weights = 512 * 64 * 2 + 64 * 4 + DIMS.n_layers * (attn + mlp)  # embedding, final norm, layers
    kv = DIMS.n_layers * 2 * 2 * DIMS.head_dim * 2 * 1024  # K and V, 2 KV heads, f16, 1000 -> 1024 cells
    assert dense == weights + kv


@pytest.mark.parametrize("budget", [SpeedupBudget(1.4), MemoryBudget(1, 2048)])
def test_budgets_are_met_by_prediction(budget: RuntimeBudget) -> None:
    costs = fitted()
    if isinstance(budget, MemoryBudget):
        low, high = budget.reachable_range(costs)
        budget = MemoryBudget((low + high) / 2, 2048)
    allocation = budget.allocate(loss_table(costs), costs)
    value = budget.achieved(costs, allocation.choice)
    assert budget.meets(value)
    assert value >= budget.target if isinstance(budget, SpeedupBudget) else value <= budget.target


def test_unreachable_budget_is_refused_with_the_reachable_range() -> None:
    costs = fitted()
    low, high = SpeedupBudget(2.0).reachable_range(costs)
    with pytest.raises(InfeasibleBudget, match=rf"reaches 1.000x to {high:.3f}x"):
        SpeedupBudget(high * 1.05).allocate(loss_table(costs), costs)
    low, _ = MemoryBudget(1, 4096).reachable_range(costs)
    with pytest.raises(InfeasibleBudget, match=r"cannot be reached: this model reaches"):
        MemoryBudget(low * 0.9, 4096).allocate(loss_table(costs), costs)


def test_sizes_parse_in_decimal_and_binary_units() -> None:
    assert parse_size("250MB") == 250_000_000 and parse_size("1 MiB") == 2**20 and parse_size("12") == 12
    with pytest.raises(ValueError, match="250MB"):
        parse_size("a lot")


def test_the_one_solver_meets_a_runtime_budget_from_a_loss_table() -> None:
    """What `plan_for` calls for a speedup budget (`budget.solver` with the runtime's costs) meets it
    from the loss table alone, and the auto profiler completes its table for that same solve."""
    from gapprune.budget import solver

    costs = fitted()
    table = loss_table(costs)
    allocation = solver(SpeedupBudget(1.3), "gap", 0, 0, None, costs)(table)
    assert SpeedupBudget(1.3).achieved(costs, allocation.choice) >= 1.3
