"""Structured optimal brain surgeon (`obs`): units chosen together with the update of the kept ones.

ZipLM and SlimGPT choose which heads or channels go from the output projection's input Hessian
H = XᵀX: removing the columns S of W and re-fitting the rest optimally adds the output error

    E(S) = tr(W_S (H⁻¹_SS)⁻¹ W_Sᵀ)          (W_S: the columns of S, H⁻¹_SS: that block of H⁻¹)

and changes the kept columns by −W_S (H⁻¹_SS)⁻¹ H⁻¹_S,: (the least-squares re-fit, which `lsq`
compensation then applies with its ridge and bias). A first-order criterion ranks units alone;
OBS ranks them greedily *given the units already gone and the update so far*: at each step the
units of least E go, W and H⁻¹ are updated, and the errors are recomputed. The removal order is the
score (first removed = lowest), so every option's "keep the top k" is the greedy OBS set.

Heads go one at a time (a head is `head_dim` columns); MLP channels in blocks of 1/64 of the width
(batched greedy, as SlimGPT), so a layer costs a few dozen rank-k updates of H⁻¹.
"""

from __future__ import annotations

import torch

from gapprune.importance.base import CRITERIA, ScoringContext

DAMP = 0.01  # H + DAMP · mean(diag H) · I, as SparseGPT: keeps H⁻¹ finite for dead or collinear columns
CHANNEL_BLOCKS = 64  # MLP channels leave in this many greedy blocks
_TINY = float(torch.tensor(1e-12, dtype=torch.float32))  # keeps the positive-definite shift of earlier releases bit for bit


def removal_errors(weight: torch.Tensor, hinv: torch.Tensor, width: int) -> torch.Tensor:
    """E(u) = tr(W_u (H⁻¹_uu)⁻¹ W_uᵀ) of every unit u (`width` consecutive columns)."""
    n_units = weight.shape[1] // width
    blocks = hinv.view(n_units, width, n_units, width).diagonal(dim1=0, dim2=2).permute(2, 0, 1)  # (units, w, w)
    w = weight.view(weight.shape[0], n_units, width).transpose(0, 1)  # (units, out, w)
    return (torch.bmm(w, torch.linalg.inv(blocks)) * w).sum((1, 2))  # small blocks: invert, don't solve


def remove_columns(weight: torch.Tensor, hinv: torch.Tensor, columns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The OBS step for the columns S: the kept columns of W − W_S (H⁻¹_SS)⁻¹ H⁻¹_S,: and of
    H⁻¹ − H⁻¹_:,S (H⁻¹_SS)⁻¹ H⁻¹_S,: (which is H⁻¹ of the kept columns). Returned compacted: each
    later step works on the columns still there, so a layer costs a third of a full-size update."""
    keep = torch.ones(hinv.shape[0], dtype=torch.bool)
    keep[columns] = False
    block_inv = torch.linalg.inv(hinv[columns][:, columns])
    rows = hinv[columns][:, keep]  # (|S|, kept)
    weight = torch.addmm(weight[:, keep], weight[:, columns] @ block_inv, rows, alpha=-1)
    kept = int(keep.sum())
    # one copy of the kept block, updated in place: an 8,960-wide MLP's H⁻¹ is 640 MB in float64,
    # and hinv[keep][:, keep] followed by an out-of-place addmm held two more of it
    compact = hinv[keep.unsqueeze(1) & keep.unsqueeze(0)].view(kept, kept)
    return weight, compact.addmm_(rows.T, block_inv @ rows, alpha=-1)


def obs_order(weight: torch.Tensor, gram: torch.Tensor, width: int, per_step: int = 1) -> list[int]:
    """Units (of `width` columns) in greedy OBS removal order, `per_step` of least error at a time."""
    w = weight.detach().double().cpu()
    h = gram.double().cpu()  # (n_in, n_in): for an MLP the largest matrix of the run, so no eye()-sized temporaries
    h.diagonal().add_(DAMP * float(h.diagonal().mean())).add_(_TINY)  # = h + DAMP·mean·I + 1e-12·I, in place
    chol = torch.linalg.cholesky(h)
    del h
    hinv = torch.cholesky_inverse(chol)
    del chol
    alive = torch.arange(w.shape[1] // width)  # original ids of the units still there, in column order
    order: list[int] = []
    while len(alive):
        take = removal_errors(w, hinv, width).argsort()[:per_step]
        order += alive[take].tolist()
        columns = (take.view(-1, 1) * width + torch.arange(width)).flatten()
        w, hinv = remove_columns(w, hinv, columns)
        kept = torch.ones(len(alive), dtype=torch.bool)
        kept[take] = False
        alive = alive[kept]
    return order


@CRITERIA.register("obs")
def obs(context: ScoringContext, layer: int, component: str) -> torch.Tensor:
    """Greedy structured OBS on the output projection: a unit's score is the step at which it would go."""
    if context.grams is None:
        raise ValueError("criterion 'obs' needs the Gram statistics of the calibration pass")
    out = context.adapter.out_proj(layer, component)
    assert out is not None
    key = (layer, component)
    context.grams.ensure(layer)  # one layer's Grams at a time (calibrate/gram.py)
    gram = context.grams.fit[key] + context.grams.held_out[key]  # every calibration token
    width = context.adapter.unit_width(component)
    n_units = out.in_features // width
    per_step = 1 if component == "attn" else max(1, n_units // CHANNEL_BLOCKS)
    scores = torch.empty(n_units, dtype=torch.float64)
    order = obs_order(out.weight, gram, width, per_step)
    scores[order] = torch.arange(n_units, dtype=torch.float64)
    return scores
