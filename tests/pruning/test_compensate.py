from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import gapprune
from gapprune.export.save import save
from gapprune.models import get_adapter
from gapprune.pipeline import prune_model_
from gapprune.refit import affine_error
from tests.helpers import tiny_run


@pytest.fixture
def calibrated(llama):
    ids = torch.randint(0, 256, (16, 64), generator=torch.Generator().manual_seed(5))
    return llama, ids, tiny_run(llama, ids, compensate="lsq", profile_samples=2)


def kl_to(dense, model, ids):
    with torch.inference_mode():
        p = F.log_softmax(dense(input_ids=ids).logits, -1)
        q = F.log_softmax(model(input_ids=ids).logits, -1)
    return float((p.exp() * (p - q)).sum(-1).mean())


def pruned(model, run, method, ratio=0.3, ridge=0.1):
    plan = run.plan(ratio, "uniform")
    out = copy.deepcopy(model)
    summary = prune_model_(out, plan, method, run.calibration.gram, ridge)
    return out, plan, summary


def test_lsq_lowers_reconstruction_error_and_final_loss(calibrated):
    model, ids, run = calibrated
    plain, plan, _ = pruned(model, run, "none")
    lsq, _, summary = pruned(model, run, "lsq")
    assert summary["applied"] > 0
    dense_adapter, a_plain, a_lsq = get_adapter(model), get_adapter(plain), get_adapter(lsq)
    layer = next(lp.layer for lp in plan.layers if 0 < len(lp.mlp.kept) < 128)
    kept = torch.tensor(plan.layers[layer].mlp.kept)
    dense_w = dense_adapter.out_proj(layer, "mlp").weight.data
    key = (layer, "mlp")
    run.calibration.gram.ensure(layer)  # Grams are held one layer at a time
    gram = run.calibration.gram.fit[key] + run.calibration.gram.held_out[key]
    total, n = run.calibration.gram.sums[key][0] + run.calibration.gram.sums[key][1], sum(run.calibration.gram.counts[key])

    def error(linear):  # Σ over all calibration tokens of ||dense output − pruned output||²
        diff = dense_w - torch.zeros_like(dense_w).index_copy_(1, kept, linear.weight.data)
        bias = linear.bias.data if linear.bias is not None else torch.zeros(dense_w.shape[0])
        return affine_error(diff, bias, gram, total, n)

    assert error(a_lsq.out_proj(layer, "mlp")) < error(a_plain.out_proj(layer, "mlp"))
    assert kl_to(model, lsq, ids) < kl_to(model, plain, ids)


def test_compensation_with_nothing_removed_changes_nothing(calibrated):
    model, ids, run = calibrated
    plan = run.plan(0.3, "uniform")
    kv = model.config.num_key_value_heads
    for lp in plan.layers:  # keep everything
        lp.attn.kept, lp.attn.option = list(range(4)), [kv, 4 // kv]
        lp.mlp.kept, lp.mlp.option = list(range(128)), [128]
    out = copy.deepcopy(model)
    prune_model_(out, plan, "lsq", run.calibration.gram)
    with torch.inference_mode():
        assert torch.equal(out(input_ids=ids).logits, model(input_ids=ids).logits)


def test_bias_compensation_saves_and_reloads_with_identical_logits(calibrated, tmp_path):
    model, ids, run = calibrated
    out, _, summary = pruned(model, run, "bias")
    assert summary["applied"] > 0
    adapter = get_adapter(out)
    assert any(adapter.out_proj(l, c) is not None and adapter.out_proj(l, c).bias is not None
               for l in range(4) for c in ("attn", "mlp"))
    folder = save(out, None, tmp_path / "biased")
    reloaded, _ = gapprune.load(str(folder))
    with torch.inference_mode():
        assert torch.equal(reloaded(input_ids=ids).logits, out(input_ids=ids).logits)


def test_lsq_with_an_infinite_ridge_is_bias_compensation(calibrated):
    """The ridge pulls kept weights to their original values, so λ → ∞ leaves only the fitted bias."""
    model, ids, run = calibrated
    stiff, _, _ = pruned(model, run, "lsq", ridge=1e9)
    biased, _, _ = pruned(model, run, "bias")
    with torch.inference_mode():
        assert torch.allclose(stiff(input_ids=ids).logits, biased(input_ids=ids).logits, atol=1e-4)


@pytest.mark.parametrize("ridge", [0.01, 1.0])
def test_lsq_refit_equals_the_float64_augmented_normal_equations(ridge):
    from gapprune.calibrate.gram import GramStats
    from gapprune.refit import lsq_affine

    g = torch.Generator().manual_seed(11)
    x = torch.randn(300, 24, generator=g, dtype=torch.float64) * torch.linspace(0.5, 2.0, 24, dtype=torch.float64) + 3.0
    weight = torch.randn(6, 24, generator=g)
    kept = torch.tensor([0, 2, 3, 7, 8, 9, 15, 20, 23])
    key = (0, "mlp")
    stats = GramStats(fit={key: (x.T @ x).float()}, sums={key: [x.sum(0), x.sum(0)]}, counts={key: [300, 300]})
    got_w, got_b = lsq_affine(weight, stats, key, kept, ridge)
    # reference: [x_K, 1] augmented, ridge towards W_K on the weights only, all in float64
    gram, w, k = x.T @ x, weight.double(), len(kept)
    lam = ridge * float(gram[kept][:, kept].diagonal().mean())
    system = torch.zeros(k + 1, k + 1, dtype=torch.float64)
    system[:k, :k] = gram[kept][:, kept] + lam * torch.eye(k, dtype=torch.float64)
    system[:k, k] = system[k, :k] = x.sum(0)[kept]
    system[k, k] = 300
    rhs = torch.cat([w @ gram[:, kept] + lam * w[:, kept], (w @ x.sum(0)).unsqueeze(1)], dim=1)
    solved = torch.linalg.solve(system, rhs.T).T
    assert torch.allclose(got_w.double(), solved[:, :k], rtol=1e-3, atol=1e-4)
    assert torch.allclose(got_b.double(), solved[:, k], rtol=1e-3, atol=1e-4)
