"""The capability metrics, defined once: `kl` (to the dense model) and `nll` (of the text).

Both are a cross-entropy against a target distribution q that the dense model fixes, plus a
constant, per position:

    M = const + lse(z) − q·z,     z = W n + b the logits of the normed final hidden state n,

kl: q = the dense next-token distribution p, const = Σ p log p (so M = KL(p‖softmax z));
nll: q = one-hot of the text's next token, const = 0, and the last position has no target.

Since q·z = n·(Wᵀq) + q·b, the dense side caches only a hidden-sized vector and a scalar per
position (`engine/head.py`), and every profiler (reference, batched, layer-major, conditional)
evaluates this one definition. A new metric registers a `Metric` here; if it is not of this form
it cannot be profiled, and the registry is the place that says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gapprune.registry import Registry

Target = Callable[[torch.Tensor, torch.Tensor | None], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Metric:
    """A metric of the form const + lse(z) − q·z (see the module docstring).

    target(dense_logits (N, V) float32, next_ids (N,) or None) -> (q, const): q is (N, V)
        probabilities or (N,) token ids (a one-hot q), const is (N,);
    shift: positions dropped at the end of every sequence (1 when the target is the next token);
    fisher_labels: the labels whose Fisher information is this metric's Hessian at the dense model
        (`model`: sampled from the dense model; `data`: the text), for the Fisher estimate.
    """

    name: str
    target: Target
    shift: int
    fisher_labels: str

    def positions(self, batch: int, seq_len: int) -> int:
        return batch * (seq_len - self.shift)


METRICS: Registry[Metric] = Registry("metric")


def register(metric: Metric) -> Metric:
    return METRICS.register(metric.name)(metric)


def _kl_target(dense_logits: torch.Tensor, next_ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    log_p = F.log_softmax(dense_logits, dim=-1)  # (N, V)
    p = log_p.exp()
    return p, (p * log_p).sum(-1)


def _nll_target(dense_logits: torch.Tensor, next_ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    assert next_ids is not None
    return next_ids, torch.zeros(next_ids.shape[0], dtype=torch.float32, device=next_ids.device)


register(Metric("kl", _kl_target, shift=0, fisher_labels="model"))
register(Metric("nll", _nll_target, shift=1, fisher_labels="data"))
