"""The one metric definition equals the textbook KL and NLL computed on full logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gapprune.engine import head as head_module
from gapprune.engine.head import make_head_reference, metric_sums, rows_per_chunk
from gapprune.engine.metrics import METRICS, Metric


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("metric", ["kl", "nll"])
def test_head_space_metric_equals_the_full_logit_definition(metric, bias):
    torch.manual_seed(0)
    norm, head = torch.nn.LayerNorm(16), torch.nn.Linear(16, 50, bias=bias)
    dense = torch.randn(2, 7, 16)
    ids = torch.randint(0, 50, (2, 7))
    pruned = torch.randn(3 * 2, 7, 16)  # three stacked replays of the batch
    reference = make_head_reference(norm, head, [dense], [ids], metric, torch.device("cpu"), chunk_rows=5)
    sums = metric_sums(norm, head, pruned, 0, reference, copies=3, chunk_rows=5)
    with torch.no_grad():
        log_p = F.log_softmax(head(norm(dense)), -1)  # (2, 7, V)
        for copy, hidden in enumerate(pruned.view(3, 2, 7, 16)):
            log_q = F.log_softmax(head(norm(hidden)), -1)
            if metric == "kl":
                expected = (log_p.exp() * (log_p - log_q)).sum()
            else:
                expected = -log_q[:, :-1].gather(-1, ids[:, 1:, None]).sum()
            assert float(sums[copy]) == pytest.approx(float(expected), rel=1e-5)


def test_the_default_chunk_holds_a_fixed_number_of_logits_whatever_the_vocabulary(monkeypatch):
    assert rows_per_chunk(0, 151_936) == head_module.LOGIT_CHUNK_ELEMENTS // 151_936 < 512
    assert rows_per_chunk(7, 151_936) == 7 and rows_per_chunk(0, 10**9) == 1
    monkeypatch.setattr(head_module, "LOGIT_CHUNK_ELEMENTS", 150)  # 3 rows of a 50-token vocabulary
    torch.manual_seed(0)
    norm, head = torch.nn.LayerNorm(16), torch.nn.Linear(16, 50)
    dense, pruned, ids = torch.randn(2, 7, 16), torch.randn(2 * 2, 7, 16), torch.randint(0, 50, (2, 7))
    sums = {}
    for chunk in (0, 14):  # 14 rows: the whole batch in one chunk
        reference = make_head_reference(norm, head, [dense], [ids], "kl", torch.device("cpu"), chunk_rows=chunk)
        sums[chunk] = metric_sums(norm, head, pruned, 0, reference, copies=2, chunk_rows=chunk)
    torch.testing.assert_close(sums[0], sums[14], rtol=1e-6, atol=1e-9)


def test_metrics_register_once_and_say_how_to_estimate_them():
    assert set(METRICS) >= {"kl", "nll"}
    assert METRICS.get("kl").fisher_labels == "model" and METRICS.get("nll").shift == 1
    with pytest.raises(ValueError, match="already registered"):
        METRICS.register("kl")(Metric("kl", METRICS.get("kl").target, 0, "model"))
    with pytest.raises(KeyError, match="unknown metric 'kll'.*Did you mean 'kl'"):
        METRICS.get("kll")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_head_is_pulled_back_block_by_block_as_a_whole_float32_cast_would(dtype):
    from gapprune.engine.head import pull_back

    g = torch.Generator().manual_seed(0)
    q = torch.softmax(torch.randn(6, 50, generator=g), dim=-1)
    weight = torch.randn(50, 8, generator=g).to(dtype)
    whole = q @ weight.float()
    torch.testing.assert_close(pull_back(q, weight, vocab_block=7), whole, rtol=1e-5, atol=1e-6)
    assert pull_back(q, weight.float()).dtype == torch.float32


@pytest.mark.parametrize("metric", ["kl", "nll"])
def test_the_dense_reference_keeps_no_autograd_graph(metric):
    """Loaded models' weights require grad; a reference built outside `no_grad` once kept every
    chunk's logits and softmax alive through its in-place writes (SmolLM2: 600 MB held all profiling)."""
    norm, head = torch.nn.LayerNorm(16), torch.nn.Linear(16, 50)
    assert head.weight.requires_grad
    reference = make_head_reference(norm, head, [torch.randn(2, 7, 16)], [torch.randint(0, 50, (2, 7))], metric,
                                    torch.device("cpu"), chunk_rows=5)
    held = [*reference.const, *reference.pulled, *reference.bias_dot]
    assert all(t is not None and not t.requires_grad and t.grad_fn is None for t in held)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("chunk_rows", [0, 3, 40])
def test_the_tiled_logsumexp_equals_the_whole_logits_one(monkeypatch, bias, chunk_rows):
    """Tiles of rows x a slice of the vocabulary, combined by one more lse: the full-logit value."""
    from gapprune.engine.head import logsumexp_logits

    monkeypatch.setattr(head_module, "LSE_TILE_ELEMENTS", {"cpu": 60})  # 0 -> 29 rows x 2 tokens: 25 slices of 50
    torch.manual_seed(0)
    head, normed = torch.nn.Linear(16, 50, bias=bias), torch.randn(29, 16)
    with torch.no_grad():
        expected = torch.logsumexp(head(normed), dim=-1)
        torch.testing.assert_close(logsumexp_logits(normed, head, chunk_rows), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("metric", ["kl", "nll"])
def test_the_metric_stays_float32_under_a_bf16_autocast(metric):
    # a bf16 replay's layers may run under autocast; its metric must not: bf16 logits move small ΔL
    torch.manual_seed(0)
    norm, head = torch.nn.LayerNorm(64), torch.nn.Linear(64, 4096)
    dense, ids = torch.randn(2, 9, 64) * 4, torch.randint(0, 4096, (2, 9))
    pruned = dense.repeat(2, 1, 1) + 0.01 * torch.randn(4, 9, 64)
    reference = make_head_reference(norm, head, [dense], [ids], metric, torch.device("cpu"))
    plain = metric_sums(norm, head, pruned, 0, reference, copies=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = metric_sums(norm, head, pruned, 0, reference, copies=2)
    assert torch.equal(plain, autocast)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # what the metric would be with a bf16 head: not the same
        rounded = head_module._metric_sums(norm, head, pruned, 0, reference, 2, 0)
    assert not torch.equal(plain, rounded)


@pytest.mark.parametrize("metric", ["kl", "nll"])
@pytest.mark.parametrize("windows,copies,tile_rows", [(1, 5, 1024), (2, 3, 8), (3, 4, 2)])
def test_a_rough_head_moves_the_metric_far_less_than_bf16_logits_do(monkeypatch, metric, windows, copies, tile_rows):
    """lse(z_d + W(n − n_d)) with the product in bf16: the float32 metric up to the difference's rounding,
    ten times nearer than rounding the logits; tiles of whole copies or of fewer rows than one copy.
    (On SmolLM2's screen the bf16 layers move ΔL more: a median 0.36% from a float32 screen, 0.32%
    with the float32 head.)"""
    from gapprune.engine.head import with_rough_head

    monkeypatch.setattr(head_module, "LSE_TILE_ROWS", tile_rows)
    monkeypatch.setattr(head_module, "LSE_TILE_ELEMENTS", {"cpu": 4096})  # several vocabulary slices
    torch.manual_seed(0)
    norm, head = torch.nn.LayerNorm(64), torch.nn.Linear(64, 4096)
    with torch.no_grad():
        head.weight.mul_(8)  # logits of a real model's spread (tens), where bf16 rounding is coarse
    dense, ids = torch.randn(windows, 9, 64) * 4, torch.randint(0, 4096, (windows, 9))
    pruned = dense.repeat(copies, 1, 1) + 0.05 * torch.randn(copies * windows, 9, 64)
    reference = make_head_reference(norm, head, [dense], [ids], metric, torch.device("cpu"))
    rough = with_rough_head(reference, norm, head, [dense], torch.device("cpu"))
    assert rough.rough is not None and reference.rough is None
    exact = metric_sums(norm, head, pruned, 0, reference, copies)
    with torch.no_grad():
        approx = metric_sums(norm, head, pruned, 0, rough, copies)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            rounded = head_module._metric_sums(norm, head, pruned, 0, reference, copies, 0)
    assert approx.shape == exact.shape == (copies,)
    assert (approx - exact).abs().max() * 10 < (rounded - exact).abs().max()
    torch.testing.assert_close(approx, exact, rtol=0.05, atol=0.0)  # ΔKL of a few thousandths here
    dense_sum = metric_sums(norm, head, dense, 0, rough, 1)  # the dense state itself: the float32 metric exactly
    torch.testing.assert_close(dense_sum, metric_sums(norm, head, dense, 0, reference, 1), rtol=0.0, atol=1e-5)


def test_a_rough_head_is_left_out_for_a_half_precision_head_and_for_logits_beyond_its_budget(monkeypatch):
    from gapprune.engine.head import with_rough_head

    norm, head = torch.nn.LayerNorm(16), torch.nn.Linear(16, 50)
    dense, ids = torch.randn(2, 5, 16), torch.randint(0, 50, (2, 5))
    reference = make_head_reference(norm, head, [dense], [ids], "kl", torch.device("cpu"))
    assert with_rough_head(reference, norm, head, [dense], torch.device("cpu")).rough is not None
    monkeypatch.setattr(head_module, "ROUGH_LOGITS_ELEMENTS", 2 * 5 * 50 - 1)
    assert with_rough_head(reference, norm, head, [dense], torch.device("cpu")).rough is None
    half = torch.nn.Linear(16, 50).to(torch.bfloat16)
    assert with_rough_head(reference, norm.to(torch.bfloat16), half, [dense], torch.device("cpu")).rough is None
