"""Structured OBS (`--criterion obs`): the removal error and update are the exact least-squares ones."""

from __future__ import annotations

import pytest
import torch

from gapprune.calibrate import gram as gram_module
from gapprune.importance import ScoringContext, score_units
from gapprune.importance.obs import (
    DAMP,
    channel_order,
    compact_,
    compacting_order,
    damped_inverse,
    inverse_root,
    obs_order,
    obs_order_tokens,
    removal_errors,
    remove_columns,
    select_,
)
from gapprune.models import get_adapter
from tests.helpers import tiny_run


def layer_problem(seed: int, out: int = 5, units: int = 4, width: int = 2):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(out, units * width, generator=g, dtype=torch.float64)
    x = torch.randn(40, units * width, generator=g, dtype=torch.float64) @ torch.randn(units * width, units * width,
                                                                                        generator=g, dtype=torch.float64)
    return weight, x.T @ x


def best_refit_error(weight: torch.Tensor, h: torch.Tensor, removed: list[int]) -> tuple[float, torch.Tensor]:
    """Brute force: min over W' with W'[:, removed] = 0 of tr((W − W') H (W − W')ᵀ), and that W'."""
    kept = [j for j in range(weight.shape[1]) if j not in removed]
    w_kept = torch.linalg.solve(h[kept][:, kept], (weight @ h[:, kept]).T).T  # normal equations on the kept columns
    refit = torch.zeros_like(weight)
    refit[:, kept] = w_kept
    diff = weight - refit
    return float(torch.trace(diff @ h @ diff.T)), refit


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_removal_error_and_update_equal_the_exact_obs_solution(seed):
    weight, h = layer_problem(seed)
    hinv = torch.linalg.inv(h)
    errors = removal_errors(weight, hinv, 2)
    for unit in range(4):
        cols = [2 * unit, 2 * unit + 1]
        expected, refit = best_refit_error(weight, h, cols)
        assert float(errors[unit]) == pytest.approx(expected, rel=1e-8)
        w, hi = remove_columns(weight, hinv.clone(), torch.tensor(cols))
        kept = [j for j in range(8) if j not in cols]
        assert torch.allclose(w, refit[:, kept], atol=1e-8)
        assert torch.allclose(hi, torch.linalg.inv(h[kept][:, kept]), atol=1e-8)


def test_greedy_order_removes_the_least_error_unit_first_and_then_the_best_given_it(seed=3):
    weight, h = layer_problem(seed)
    damped = h + 0.01 * float(h.diagonal().mean()) * torch.eye(8, dtype=torch.float64)
    order = obs_order(weight, h, 2, dtype=torch.float64)
    assert sorted(order) == [0, 1, 2, 3]
    cols = lambda units: [c for u in units for c in (2 * u, 2 * u + 1)]
    first = min(range(4), key=lambda u: best_refit_error(weight, damped, cols([u]))[0])
    assert order[0] == first
    second = min((u for u in range(4) if u != first), key=lambda u: best_refit_error(weight, damped, cols([first, u]))[0])
    assert order[1] == second


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_single_column_units_take_the_diagonal_path_with_the_block_formula_s_exact_numbers(dtype):
    # MLP channels (width 1) skip the batched 1 × 1 inverses; they must give the block formula's errors
    g = torch.Generator().manual_seed(7)
    weight = torch.randn(6, 30, generator=g, dtype=dtype)
    x = torch.randn(50, 30, generator=g, dtype=dtype)
    hinv = torch.linalg.inv(x.T @ x + torch.eye(30, dtype=dtype))
    w = weight.view(6, 30, 1).transpose(0, 1)  # (units, out, 1): the general path's layout
    blocks = hinv.diagonal().view(30, 1, 1)
    via_blocks = (torch.bmm(w, torch.linalg.inv(blocks)) * w).sum((1, 2))
    assert torch.equal(removal_errors(weight, hinv, 1), via_blocks)
    assert torch.allclose(removal_errors(weight, hinv, 1), (weight.square() / hinv.diagonal()).sum(0), rtol=1e-5)


@pytest.mark.parametrize(("seed", "width"), [(4, 1), (5, 2), (6, 3)])
def test_every_greedy_step_removes_the_unit_of_least_refit_error_given_those_gone(seed, width):
    units = 6
    weight, h = layer_problem(seed, out=4, units=units, width=width)
    damped = h + 0.01 * float(h.diagonal().mean()) * torch.eye(units * width, dtype=torch.float64)
    cols = lambda us: [u * width + i for u in us for i in range(width)]
    order = obs_order(weight, h, width, dtype=torch.float64)
    for step in range(units - 1):  # the last unit is whatever is left
        rest = [u for u in range(units) if u not in order[:step]]
        best = min(rest, key=lambda u: best_refit_error(weight, damped, cols(order[:step] + [u]))[0])
        assert order[step] == best


@pytest.mark.parametrize(("per_step", "flush_every", "upper_block"), [(1, 1, 1024), (3, 2, 1024), (4, 8, 1024),
                                                                    (5, 100, 1024), (3, 2, 8), (4, 3, 16)])
def test_deferred_channel_updates_give_the_order_of_updating_at_every_step(per_step, flush_every, upper_block,
                                                                           monkeypatch):
    monkeypatch.setattr(gram_module, "UPPER_BLOCK", upper_block)  # 8, 16: the flushes update upper blocks, mirrored
    g = torch.Generator().manual_seed(11)
    weight = torch.randn(12, 60, generator=g, dtype=torch.float64)
    x = torch.randn(200, 60, generator=g, dtype=torch.float64) @ torch.randn(60, 60, generator=g, dtype=torch.float64)
    hinv = damped_inverse(x.T @ x, torch.float64)
    eager = compacting_order(weight, hinv.clone(), 1, per_step)
    assert sorted(eager) == list(range(60))
    before = weight.clone()
    assert channel_order(weight, hinv.clone(), per_step, flush_every) == eager
    assert torch.equal(weight, before)  # the model's weight is read, never updated in place


@pytest.mark.parametrize("n", [7, 300])
def test_in_place_compaction_equals_the_masked_copy(n):
    matrix = torch.randn(n, n, dtype=torch.float64)
    keep = torch.rand(n, generator=torch.Generator().manual_seed(n)) > 0.3
    expected = matrix[keep][:, keep].clone()
    assert torch.equal(compact_(matrix, keep, rows_per_copy=16), expected)


def test_in_place_row_and_column_selection_equals_the_indexed_copy():
    matrix = torch.randn(50, 80, dtype=torch.float64)
    rows, columns = torch.arange(50), torch.tensor([0, 3, 4, 9, 40, 41, 79])
    expected = matrix[:, columns].clone()
    selected = select_(matrix, rows, columns, rows_per_copy=8)
    assert torch.equal(selected, expected) and selected.data_ptr() == matrix.data_ptr()


def test_damped_inverse_works_in_its_own_buffer_and_equals_the_inverse_of_the_summed_halves():
    g = torch.Generator().manual_seed(3)
    halves = [(x := torch.randn(200, 96, generator=g)).T @ x for _ in range(2)]
    total = halves[0] + halves[1]
    before = [h.clone() for h in halves]
    inverse = damped_inverse(halves, torch.float32)
    assert inverse.is_contiguous()  # row-major, as the in-place compaction needs
    assert torch.equal(inverse, damped_inverse(total, torch.float32))  # the parts summed exactly as the caller did
    damped = total.double() + DAMP * float(total.diagonal().mean()) * torch.eye(96, dtype=torch.float64)
    torch.testing.assert_close(inverse.double(), torch.linalg.inv(damped), rtol=1e-4, atol=1e-7)
    assert all(torch.equal(h, b) for h, b in zip(halves, before, strict=True))  # the halves are read, not written


def test_orders_from_parts_equal_the_orders_from_the_joined_statistics():
    g = torch.Generator().manual_seed(5)
    weight = torch.randn(8, 64, generator=g)
    fit, held_out = (torch.randn(6, 64, generator=g) * torch.linspace(0.2, 3.0, 64) for _ in range(2))
    joined = torch.cat([fit, held_out])
    before = joined.clone()
    assert obs_order_tokens(weight, [fit, held_out], 1, 4) == obs_order_tokens(weight, joined, 1, 4)
    assert obs_order(weight, [fit.T @ fit, held_out.T @ held_out], 1, 4) == obs_order(weight, joined.T @ joined, 1, 4)
    assert torch.equal(torch.cat([fit, held_out]), before) and torch.equal(joined, before)  # the caller's rows stay


def test_float32_solve_keeps_the_float64_order_on_a_well_conditioned_layer():
    g = torch.Generator().manual_seed(7)
    weight = torch.randn(16, 64, generator=g)
    x = torch.randn(512, 64, generator=g) * torch.linspace(0.2, 3.0, 64)
    h = x.T @ x
    assert obs_order(weight, h, 1, 4, dtype=torch.float32) == obs_order(weight, h, 1, 4, dtype=torch.float64)


def test_obs_scores_rank_every_unit_of_a_real_model(llama, token_ids):
    run = tiny_run(llama, token_ids, criterion="obs")
    assert run.calibration.gram is not None  # obs asks the calibration pass for the Grams
    for layer in range(run.adapter.n_layers):
        for c, n in (("attn", run.adapter.layer_shape(layer).n_heads), ("mlp", run.adapter.layer_shape(layer).intermediate)):
            assert sorted(run.calibration.scores.get(layer, c).tolist()) == list(range(n))


def test_obs_needs_the_gram_statistics(llama):
    with pytest.raises(ValueError, match="Gram"):
        score_units(ScoringContext(get_adapter(llama)), "obs")


@pytest.mark.parametrize("indefinite", [False, True])
def test_inverse_root_whitens_a_block_and_survives_one_rounding_made_indefinite(indefinite):
    g = torch.Generator().manual_seed(2)
    a = torch.randn(6, 6, generator=g, dtype=torch.float64)
    block = a @ a.T + 0.5 * torch.eye(6, dtype=torch.float64)
    if indefinite:
        values, vectors = torch.linalg.eigh(block)
        values[0] = -1e-9  # what rounding does to the last channels' block
        block = (vectors * values) @ vectors.T
    m = inverse_root(block)
    assert torch.isfinite(m).all()
    if not indefinite:
        torch.testing.assert_close(m.T @ m, torch.linalg.inv(block))
    else:
        projected = m @ block @ m.T  # the identity on the block's positive eigenvectors
        torch.testing.assert_close(projected[1:, 1:].diagonal(), torch.ones(5, dtype=torch.float64), rtol=1e-6, atol=1e-6)
