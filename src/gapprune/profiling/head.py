"""The capability metrics computed from final hidden states in bounded memory, without full logits kept.

Both metrics need, per position, only logsumexp of the logits and one dot product:

    KL(p‖q) = Σ p log p − Σ p·z + lse(z),   Σ p·z = n·(Wᵀp) (+ p·b)
    NLL     = lse(z) − z[target],            z[target] = n·W[target] (+ b[target])

with z = W n + b the logits of the normed hidden state n. So the dense side is cached once as the
"pulled-back" vector Wᵀp (hidden-sized, not vocabulary-sized) and each option costs one head matmul
and one logsumexp, done in row chunks so memory stays at `chunk_rows` x vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class HeadReference:
    """The dense side of a metric for every calibration batch, all hidden-sized.

    neg_entropy[b]: (B, T) Σ p log p (kl); pulled[b]: (B, T, h) Wᵀp; pulled_bias[b]: (B, T) p·b or None;
    target_rows[b]: (B, T-1, h) W[target] and target_bias[b]: (B, T-1) or None (nll).
    """

    metric: str
    neg_entropy: list[torch.Tensor]
    pulled: list[torch.Tensor]
    pulled_bias: list[torch.Tensor | None]
    target_rows: list[torch.Tensor]
    target_bias: list[torch.Tensor | None]


def _rows(x: torch.Tensor, chunk_rows: int) -> list[slice]:
    return [slice(i, min(i + chunk_rows, x.shape[0])) for i in range(0, x.shape[0], chunk_rows)]


def _weight(head: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    if not isinstance(head, nn.Linear):
        raise TypeError(f"the batched profiler needs a linear LM head, got {type(head).__name__}")
    return head.weight, head.bias


def logsumexp_logits(normed: torch.Tensor, head: nn.Module, chunk_rows: int) -> torch.Tensor:
    """lse(W n + b) in float32 for normed (N, h) -> (N,), chunk_rows rows of logits at a time."""
    weight, bias = _weight(head)
    out = torch.empty(normed.shape[0], dtype=torch.float32, device=normed.device)
    for rows in _rows(normed, chunk_rows):
        logits = F.linear(normed[rows], weight, bias).float()
        out[rows] = torch.logsumexp(logits, dim=-1)
    return out


def make_head_reference(norm: nn.Module, head: nn.Module, final_hidden: list[torch.Tensor], input_ids: list[torch.Tensor],
                        metric: str, device: torch.device, chunk_rows: int = 512) -> HeadReference:
    weight, bias = _weight(head)
    reference = HeadReference(metric, [], [], [], [], [])
    for hidden, ids in zip(final_hidden, input_ids, strict=True):
        normed = norm(hidden.to(device, weight.dtype))
        b, t, h = normed.shape
        flat = normed.reshape(b * t, h)
        if metric == "kl":
            neg_entropy = torch.empty(b * t, dtype=torch.float32, device=device)
            pulled = torch.empty(b * t, h, dtype=torch.float32, device=device)
            pulled_bias = torch.empty(b * t, dtype=torch.float32, device=device) if bias is not None else None
            for rows in _rows(flat, chunk_rows):
                log_p = F.log_softmax(F.linear(flat[rows], weight, bias).float(), dim=-1)
                p = log_p.exp()
                neg_entropy[rows] = (p * log_p).sum(-1)
                pulled[rows] = p @ weight.float()
                if pulled_bias is not None:
                    pulled_bias[rows] = p @ bias.float()
            reference.neg_entropy.append(neg_entropy.view(b, t))
            reference.pulled.append(pulled.view(b, t, h))
            reference.pulled_bias.append(pulled_bias.view(b, t) if pulled_bias is not None else None)
        elif metric == "nll":
            targets = ids[:, 1:].to(device)
            reference.target_rows.append(weight[targets].float())  # (B, T-1, h)
            reference.target_bias.append(bias[targets].float() if bias is not None else None)
        else:
            raise ValueError(f"unknown metric {metric!r}; choose kl or nll")
    return reference


def metric_sums(norm: nn.Module, head: nn.Module, hidden: torch.Tensor, batch: int, reference: HeadReference,
                copies: int, chunk_rows: int = 512) -> torch.Tensor:
    """Summed metric of each of `copies` stacked option replays. hidden: (copies*B, T, h) -> (copies,) float64."""
    normed = norm(hidden)
    n, t, h = normed.shape
    lse = logsumexp_logits(normed.reshape(n * t, h), head, chunk_rows).view(copies, n // copies, t)
    normed = normed.float().view(copies, n // copies, t, h)
    if reference.metric == "kl":
        cross = (normed * reference.pulled[batch]).sum(-1) - lse  # Σ p log q, (copies, B, T)
        if reference.pulled_bias[batch] is not None:
            cross = cross + reference.pulled_bias[batch]
        per_token = reference.neg_entropy[batch] - cross
    else:
        picked = (normed[:, :, :-1] * reference.target_rows[batch]).sum(-1)
        if reference.target_bias[batch] is not None:
            picked = picked + reference.target_bias[batch]
        per_token = lse[:, :, :-1] - picked
    return per_token.double().sum(dim=(1, 2))
