"""Grams held as their rows (`TokenGram`, t ≪ n): the token-space solves equal the n × n ones.

A Llama-3-8B MLP is 14,336 wide, so its Gram is 822 MB per half in float32 while 512 calibration
tokens are 29 MB of rows; OBS and lsq then solve t × t systems (Woodbury). These tests hold both
forms of one layer and compare orders, refits and errors, and check the switch in `gram_observer`.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gapprune.calibrate.gram import GramStats, TokenGram, gram_observer, quadratic
from gapprune.engine.observe import observing
from gapprune.importance.obs import obs_order, obs_order_tokens
from gapprune.refit import (
    affine_error,
    lsq_affine,
    reconstruction_error,
    refit_error,
    removal_error,
)


def rows_and_weight(seed: int, t: int = 12, n: int = 48, out: int = 5, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(t, n, generator=g, dtype=dtype) * torch.linspace(0.3, 3.0, n, dtype=dtype)) + 0.5
    return x, torch.randn(out, n, generator=g, dtype=dtype)


@pytest.mark.parametrize(("seed", "width", "per_step"), [(0, 1, 1), (1, 1, 4), (2, 4, 1), (3, 3, 2)])
def test_token_space_obs_order_equals_the_dense_order(seed, width, per_step):
    x, w = rows_and_weight(seed)
    dense = obs_order(w, x.T @ x, width, per_step, dtype=torch.float64)
    assert obs_order_tokens(w, x, width, per_step, dtype=torch.float64) == dense
    assert sorted(dense) == list(range(48 // width))


@pytest.mark.parametrize("ridge", [0.01, 1.0])
def test_token_space_lsq_refit_equals_the_dense_refit(ridge):
    x, w = rows_and_weight(4, dtype=torch.float32)
    key, kept = (0, "mlp"), torch.tensor([1, 2, 5, 8, 13, 21, 34, 40, 41, 47])
    sums, counts = {key: [x.double().sum(0), x.double().sum(0)]}, {key: [12, 12]}
    dense = lsq_affine(w, GramStats(fit={key: x.T @ x}, sums=sums, counts=counts), key, kept, ridge)
    rows = lsq_affine(w, GramStats(fit={key: TokenGram(48, [x])}, sums=sums, counts=counts), key, kept, ridge)
    for a, b in zip(dense, rows, strict=True):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-4)


def test_token_space_errors_equal_the_dense_errors():
    x, w = rows_and_weight(5, dtype=torch.float32)
    d, bias = torch.randn_like(w), torch.randn(w.shape[0])
    dense, rows = x.T @ x, TokenGram(48, [x[:7], x[7:]])
    assert float(quadratic(d, rows)) == pytest.approx(float(quadratic(d, dense)), rel=1e-5)
    assert reconstruction_error(w, w - d, rows) == pytest.approx(reconstruction_error(w, w - d, dense), rel=1e-5)
    total = x.double().sum(0)
    assert affine_error(d, bias, rows, total, 12) == pytest.approx(affine_error(d, bias, dense, total, 12), rel=1e-5)
    kept = torch.tensor([0, 3, 4, 10, 11, 30, 47])
    assert removal_error(w, kept, rows) == pytest.approx(removal_error(w, kept, dense), rel=1e-5)
    refit = torch.randn(w.shape[0], len(kept))
    assert refit_error(w, kept, refit, bias, rows, total, 12) == pytest.approx(
        refit_error(w, kept, refit, bias, dense, total, 12), rel=1e-4)


@pytest.mark.parametrize(("tokens", "expect_rows"), [(4, True), (64, False)])
def test_gram_observer_keeps_rows_only_when_few_tokens_face_a_wide_input(tokens, expect_rows):
    linear, stats = nn.Linear(64, 3), GramStats()
    batches = [torch.randn(2, tokens // 2, 64, generator=torch.Generator().manual_seed(b)) for b in range(2)]
    with observing([(linear, gram_observer(linear, (0, "mlp"), stats, tokens_per_half=tokens))]):
        for batch in batches:
            linear(batch)
    fit = stats.fit[(0, "mlp")]
    assert isinstance(fit, TokenGram) is expect_rows
    expected = batches[0].reshape(-1, 64).T @ batches[0].reshape(-1, 64)
    assert torch.allclose(fit.dense() if expect_rows else fit, expected, atol=1e-4)


def test_a_model_pruned_through_token_grams_matches_the_dense_gram_prune(monkeypatch):
    """obs scores and the lsq-compensated model of a tiny Qwen2, with every Gram forced into rows
    (factor 0) against every Gram forced dense (factor 10⁹)."""
    import copy
    import importlib

    import gapprune.calibrate.gram as gram_module
    sequential_module = importlib.import_module("gapprune.pruning.sequential")  # gapprune.prune: also a function
    from gapprune.models import get_adapter
    from gapprune.pipeline import prune_model_
    from gapprune.pruning.sequential import prune_sequentially_
    from tests.conftest import tiny_qwen2
    from tests.helpers import tiny_run
    from tests.precision.contracts import IDS

    model, results = tiny_qwen2(), {}
    for name, factor in (("rows", 0), ("dense", 10**9)):
        monkeypatch.setattr(gram_module, "TOKEN_ROWS_FACTOR", factor)
        monkeypatch.setattr(sequential_module, "LSQ_ROWS_FACTOR", factor)
        run = tiny_run(model, IDS, criterion="obs", compensate="lsq")
        run.calibration.gram.ensure(0)
        assert isinstance(run.calibration.gram.fit[(0, "mlp")], TokenGram) is (name == "rows")
        plan = run.plan(0.3, "uniform")
        pruned = copy.deepcopy(model)
        summary = prune_model_(pruned, plan, "lsq", run.calibration.gram)
        sequential = copy.deepcopy(model)
        prune_sequentially_(get_adapter(sequential), plan, run.calibration.inputs, "lsq")
        with torch.inference_mode():
            results[name] = (run.calibration.scores, plan, summary, pruned(input_ids=IDS).logits,
                             sequential(input_ids=IDS).logits)
    (scores_r, plan_r, summary_r, logits_r, seq_r), (scores_d, plan_d, summary_d, logits_d, seq_d) = \
        results["rows"], results["dense"]
    for layer in range(4):
        for c in ("attn", "mlp"):
            assert torch.equal(scores_r.get(layer, c), scores_d.get(layer, c))
    assert [lp.mlp.kept for lp in plan_r.layers] == [lp.mlp.kept for lp in plan_d.layers]
    assert summary_r["applied"] == summary_d["applied"] > 0
    assert torch.allclose(logits_r, logits_d, atol=1e-3, rtol=1e-3)
    assert torch.allclose(seq_r, seq_d, atol=1e-3, rtol=1e-3)
