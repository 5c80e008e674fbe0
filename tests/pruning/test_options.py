from __future__ import annotations

import torch

from gapprune.options import (
    attention_options,
    default_channel_step,
    mlp_options,
    select_channels,
    select_heads,
)


def test_attention_options_cover_every_pair_full_first_removed_last():
    options = attention_options(3, 3)
    assert options[0] == (3, 3) and options[-1] == (0, 0)
    assert len(options) == 10 and len(set(options)) == 10


def test_mlp_options_step_down_to_zero():
    assert mlp_options(1536, default_channel_step(1536)) == list(range(1536, 0, -48)) + [0]
    assert mlp_options(100, 48) == [100, 52, 4, 0]


def test_select_heads_keeps_best_heads_of_best_groups():
    scores = torch.tensor([5.0, 1.0, 0.0, 3.0, 2.5, 1.0])  # 3 groups of 2 heads
    assert select_heads(scores, 3, 1, 1) == [0]  # group 0's best head (5) beats group 1's (3)
    assert select_heads(scores, 3, 1, 2) == [0, 1]  # group sums 6, 3, 3.5
    assert select_heads(scores, 3, 2, 2) == [0, 1, 4, 5]
    assert select_heads(scores, 3, 2, 1) == [0, 3]  # best single heads: 5 (group 0), 3 (group 1 or 2)
    assert select_heads(scores, 3, 0, 0) == []


def test_select_channels_sorted_top():
    assert select_channels(torch.tensor([0.1, 3.0, 2.0, 0.5]), 2) == [1, 2]
