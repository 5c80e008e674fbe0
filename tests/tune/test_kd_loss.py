from __future__ import annotations

import torch
import torch.nn.functional as F

from gapprune.tune.kd_loss import kl_full, kl_topk, lm_loss, teacher_topk


def logits(seed: int, shape=(2, 5, 11)) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 3


def test_full_kl_is_zero_on_itself_positive_otherwise_and_matches_torch():
    s, t = logits(0), logits(1)
    assert float(kl_full(t, t)) < 1e-6
    expected = F.kl_div(F.log_softmax(s, -1).reshape(-1, 11), F.log_softmax(t, -1).reshape(-1, 11),
                        log_target=True, reduction="batchmean")
    assert torch.allclose(kl_full(s, t), expected, atol=1e-6)
    assert torch.allclose(kl_full(s, t, temperature=2.0),
                          4 * F.kl_div(F.log_softmax(s / 2, -1).reshape(-1, 11), F.log_softmax(t / 2, -1).reshape(-1, 11),
                                       log_target=True, reduction="batchmean"), atol=1e-6)


def test_topk_with_the_whole_vocabulary_equals_the_full_kl_and_bounds_it_below_otherwise():
    s, t = logits(2), logits(3)
    values, ids = teacher_topk(t, 11)
    assert torch.allclose(kl_topk(s, values, ids), kl_full(s, t), atol=1e-4)
    values, ids = teacher_topk(t, 3)
    assert 0 < float(kl_topk(s, values, ids)) <= float(kl_full(s, t)) + 1e-6  # merging bins lowers the KL


def test_mask_drops_positions_and_lm_loss_is_next_token_cross_entropy():
    s, t = logits(4), logits(5)
    mask = torch.zeros(2, 5)
    mask[0] = 1
    assert torch.allclose(kl_full(s, t, mask=mask), kl_full(s[:1], t[:1]), atol=1e-6)
    ids = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(6))
    expected = F.cross_entropy(s[:, :-1].reshape(-1, 11), ids[:, 1:].reshape(-1))
    assert torch.allclose(lm_loss(s, ids), expected, atol=1e-6)
