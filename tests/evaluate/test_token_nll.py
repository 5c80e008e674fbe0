"""The chunked LM head gives the same NLL as the model's own full logits, whatever the chunk."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gapprune.evaluate.perplexity import token_nll


@pytest.mark.parametrize("chunk", [1, 7, 23, 1000])  # one position, chunks across windows, all at once
def test_chunked_head_matches_full_logits(llama, token_ids, chunk):
    with torch.inference_mode():
        logits = llama(input_ids=token_ids).logits[:, :-1].float()  # (B, T-1, V)
        reference = F.cross_entropy(logits.transpose(1, 2), token_ids[:, 1:], reduction="none").double().sum(dim=1)
        chunked = token_nll(llama, token_ids, chunk=chunk)
    assert chunked.shape == (token_ids.shape[0],)
    torch.testing.assert_close(chunked, reference, rtol=1e-5, atol=1e-4)
