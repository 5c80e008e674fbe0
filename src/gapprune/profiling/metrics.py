"""Global capability metrics on the model's next-token distribution: `kl` (to the dense model) and `nll`.

Both are computed from final hidden states with the LM head applied in chunks of positions, so the
(B, T, vocab) logits never exist at once for long windows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from gapprune.registry import Registry


@dataclass
class DenseReference:
    """What the metrics compare against, per calibration batch.

    log_probs[b]: (B, T, V) dense log-probabilities (kl); targets[b]: (B, T-1) next tokens (nll).
    """

    log_probs: list[torch.Tensor]
    targets: list[torch.Tensor]


Metric = Callable[[torch.Tensor, int, DenseReference], torch.Tensor]
METRICS: Registry[Metric] = Registry("metric")


def head_log_probs(norm: nn.Module, head: nn.Module, hidden: torch.Tensor, chunk: int = 512) -> torch.Tensor:
    """log-softmax(head(norm(hidden))) in chunks of positions. hidden (B, T, h) -> (B, T, V) float32."""
    parts = []
    for start in range(0, hidden.shape[1], chunk):
        logits = head(norm(hidden[:, start : start + chunk])).float()
        parts.append(F.log_softmax(logits, dim=-1))
    return torch.cat(parts, dim=1)


@METRICS.register("kl")
def kl_metric(log_probs: torch.Tensor, batch: int, reference: DenseReference) -> torch.Tensor:
    """Summed per-token KL(dense || pruned) over the batch's positions. -> scalar float64."""
    dense = reference.log_probs[batch]  # (B, T, V)
    return (dense.exp() * (dense - log_probs)).sum().double()


@METRICS.register("nll")
def nll_metric(log_probs: torch.Tensor, batch: int, reference: DenseReference) -> torch.Tensor:
    """Summed next-token NLL over the batch. -> scalar float64."""
    targets = reference.targets[batch]  # (B, T-1)
    picked = log_probs[:, :-1].gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return (-picked).sum().double()


def metric_positions(metric: str, log_probs_shape: torch.Size) -> int:
    """How many positions a metric sums over for one batch (to turn sums into means)."""
    b, t = log_probs_shape[0], log_probs_shape[1]
    return b * (t - 1) if metric == "nll" else b * t
