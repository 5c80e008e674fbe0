"""The option vocabulary: each component's options, what each keeps and what it costs.

Below both profiling/ (which measures options) and prune/ (which applies the chosen ones), so
neither reaches into the other for it.

Attention options are pairs (g KV groups kept, q query heads kept per group), including (0, 0),
the removed sub-block. MLP options keep `intermediate - k * channel_step` channels, down to 0.
Option 0 is always "nothing removed".
"""

from __future__ import annotations

import torch

from gapprune.importance.base import UnitScores
from gapprune.models.adapter import ModelAdapter


def default_channel_step(intermediate: int, steps: int = 32) -> int:
    """intermediate / steps rounded to a multiple of 8 (at least 8, at most intermediate)."""
    return max(8, min(intermediate, round(intermediate / steps / 8) * 8))


def attention_options(n_kv_heads: int, n_rep: int) -> list[tuple[int, int]]:
    """All (g, q) pairs, the full one first and (0, 0) last, ordered by kept heads descending."""
    pairs = [(g, q) for g in range(1, n_kv_heads + 1) for q in range(1, n_rep + 1)]
    pairs.sort(key=lambda gq: (-gq[0] * gq[1], -gq[0]))
    return pairs + [(0, 0)]


def mlp_options(intermediate: int, channel_step: int) -> list[int]:
    """Kept channel counts: intermediate, intermediate - step, ..., down to 0 (always included)."""
    if channel_step <= 0:
        raise ValueError(f"channel_step must be positive, got {channel_step}")
    kept = list(range(intermediate, 0, -channel_step))
    return kept + [0]


def select_heads(head_scores: torch.Tensor, n_kv_heads: int, groups: int, per_group: int) -> list[int]:
    """Query heads kept by option (g, q): the g groups whose q best heads score highest, and inside
    each those q best heads. head_scores (n_heads,), heads of group j are j*n_rep ... j*n_rep+n_rep-1."""
    if groups == 0 or per_group == 0:
        return []
    n_rep = head_scores.numel() // n_kv_heads
    by_group = head_scores.view(n_kv_heads, n_rep)  # (n_kv, n_rep)
    top = by_group.topk(per_group, dim=1)  # best q heads per group
    group_value = top.values.sum(1)  # (n_kv,)
    chosen = group_value.topk(groups).indices.tolist()
    return sorted(g * n_rep + int(i) for g in chosen for i in top.indices[g].tolist())


def select_channels(channel_scores: torch.Tensor, kept: int) -> list[int]:
    """The `kept` highest-scoring channels, sorted."""
    if kept == 0:
        return []
    return sorted(channel_scores.topk(kept).indices.tolist())


def kept_units(scores: UnitScores, adapter: ModelAdapter, layer: int, component: str, option: list[int]) -> list[int]:
    """Unit ids the option keeps, chosen by the scores."""
    shape = adapter.layer_shape(layer)
    if component == "attn":
        g, q = option
        return select_heads(scores.get(layer, "attn"), shape.n_kv_heads, g, q)
    return select_channels(scores.get(layer, "mlp"), option[0])


def option_params(adapter: ModelAdapter, layer: int, component: str, option: list[int]) -> int:
    """Parameters the component keeps under `option`."""
    if component == "attn":
        return adapter.attn_option_params(layer, option[0], option[1])
    return adapter.mlp_option_params(layer, option[0])
