"""Global capability metrics on the model's next-token distribution: `kl` (to the dense model) and `nll`.

Metrics take raw logits and use logsumexp, so no log-softmax tensor is materialised per option;
the dense side (probabilities and Σ p·log p) is computed once.
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

    probs[b]: (B, T, V) dense next-token probabilities; neg_entropy[b]: (B, T) Σ p·log p (kl);
    targets[b]: (B, T-1) next tokens (nll).
    """

    probs: list[torch.Tensor]
    neg_entropy: list[torch.Tensor]
    targets: list[torch.Tensor]


Metric = Callable[[torch.Tensor, int, DenseReference], torch.Tensor]
METRICS: Registry[Metric] = Registry("metric")


def head_logits(norm: nn.Module, head: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """head(norm(hidden)) in float32. hidden (B, T, h) -> (B, T, V)."""
    return head(norm(hidden)).float()


def make_reference(norm: nn.Module, head: nn.Module, final_hidden: list[torch.Tensor], input_ids: list[torch.Tensor],
                   device: torch.device) -> DenseReference:
    probs, neg_entropy = [], []
    for hidden in final_hidden:
        log_p = F.log_softmax(head_logits(norm, head, hidden.to(device, head.weight.dtype)), dim=-1)  # (B, T, V)
        p = log_p.exp()
        probs.append(p)
        neg_entropy.append((p * log_p).sum(-1))
    return DenseReference(probs, neg_entropy, [ids[:, 1:].to(device) for ids in input_ids])


@METRICS.register("kl")
def kl_metric(logits: torch.Tensor, batch: int, reference: DenseReference) -> torch.Tensor:
    """Summed per-token KL(dense || pruned) over the batch: Σ p log p − (Σ p·z − logsumexp z)."""
    p = reference.probs[batch]  # (B, T, V), rows sum to 1
    cross = (p * logits).sum(-1) - torch.logsumexp(logits, dim=-1)  # (B, T) = Σ p log q
    return (reference.neg_entropy[batch] - cross).sum().double()


@METRICS.register("nll")
def nll_metric(logits: torch.Tensor, batch: int, reference: DenseReference) -> torch.Tensor:
    """Summed next-token NLL over the batch: logsumexp z − z[target]."""
    targets = reference.targets[batch]  # (B, T-1)
    z = logits[:, :-1]
    picked = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return (torch.logsumexp(z, dim=-1) - picked).sum().double()


def metric_positions(metric: str, logits_shape: torch.Size) -> int:
    """How many positions a metric sums over for one batch (to turn sums into means)."""
    b, t = logits_shape[0], logits_shape[1]
    return b * (t - 1) if metric == "nll" else b * t
