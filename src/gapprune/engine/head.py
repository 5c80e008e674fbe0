"""Evaluating a metric from final hidden states in bounded memory, without full logits kept.

Every metric is const + lse(z) − q·z per position (`metrics.py`), and q·z = n·(Wᵀq) + q·b. So the
dense side is cached once as the "pulled-back" vector Wᵀq (hidden-sized, not vocabulary-sized) and
the scalars const and q·b; each replay then costs one head matmul and one logsumexp, done in tiles
so memory stays bounded. A tile or chunk holds `LOGIT_CHUNK_ELEMENTS` logits whatever the vocabulary
(512 rows of a 151,936-token head were 311 MB per float32 copy, and a chunk makes three: logits,
their float32 cast or softmax, the exp): the dense reference in row chunks over the whole
vocabulary (its softmax needs every logit of a row), each replay's logsumexp in tiles of many rows
and a slice of the vocabulary (`logsumexp_logits`), which keep the matmul at full speed.
A replay whose layers run in bf16 (an estimate: the auto profiler's screen) may take the head's
product in bf16 too, of the difference from the dense state (`RoughHead`), which rounding moves far
less than it moves the logits themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from gapprune.engine.capture import LayerInputs
from gapprune.engine.metrics import METRICS, Metric
from gapprune.models.adapter import ModelAdapter


@dataclass
class HeadReference:
    """The dense side of a metric for every calibration batch, all hidden-sized.

    const[b]: (B, T') per position; pulled[b]: (B, T', h) Wᵀq; bias_dot[b]: (B, T') q·b, None without
    a head bias; T' = T − metric.shift.
    """

    metric: Metric
    const: list[torch.Tensor]
    pulled: list[torch.Tensor]
    bias_dot: list[torch.Tensor | None]
    rough: RoughHead | None = None


@dataclass
class RoughHead:
    """What a bf16 replay's logsumexp starts from (`with_rough_head`): per batch the dense logits z_d and
    normed final states n_d, both float32, and the head in bf16.

    lse(W n + b) = lse(z_d + W (n − n_d)): the bf16 product is of the difference from the dense state,
    small beside the logits themselves, so its rounding moves the logsumexp by a fraction of what
    rounding the logits to bf16 does (`tests/profiling/test_metrics.py`), at the speed of a bf16 head.

    logits[b]: (P_b, V) float32, P_b the positions of batch b; normed[b]: (P_b, h) float32;
    weight: (V, h) bf16.
    """

    logits: list[torch.Tensor]
    normed: list[torch.Tensor]
    weight: torch.Tensor


LOGIT_CHUNK_ELEMENTS = 1 << 24  # logits per chunk by default: 64 MB in float32
LSE_TILE_ROWS = 1024  # rows per logsumexp tile by default; the vocabulary is cut to fit the tile's logits
# Logits per logsumexp tile by device type (else LOGIT_CHUNK_ELEMENTS): on a CPU a 4 MB tile is still
# in cache when its logsumexp reads it back (two cores, 4,096 rows: SmolLM2's head 1.57 s against
# 1.91 s for 2,048 x 8,192 tiles, Qwen2.5-1.5B's 5.4 s against 6.3 s on 2,048 rows; §10 of
# docs/performance.md); a GPU wants its matmuls large.
LSE_TILE_ELEMENTS = {"cpu": 1 << 20}


def rows_per_chunk(chunk_rows: int, vocab: int) -> int:
    """`chunk_rows`, or with 0 the rows whose logits fit `LOGIT_CHUNK_ELEMENTS` (at least one)."""
    return chunk_rows if chunk_rows > 0 else max(1, LOGIT_CHUNK_ELEMENTS // vocab)


def _rows(x: torch.Tensor, chunk_rows: int, vocab: int) -> list[slice]:
    step = rows_per_chunk(chunk_rows, vocab)
    return [slice(i, min(i + step, x.shape[0])) for i in range(0, x.shape[0], step)]


def _weight(head: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    if not isinstance(head, nn.Linear):
        raise TypeError(f"the profilers need a linear LM head, got {type(head).__name__}")
    return head.weight, head.bias


def pull_back(q: torch.Tensor, weight: torch.Tensor, vocab_block: int = 8192) -> torch.Tensor:
    """q @ W in float32 for q (rows, V) float32 and W (V, h) in the model's dtype.

    A bf16 or fp16 head is cast a block of the vocabulary at a time: casting it whole would hold a
    float32 copy of the head (933 MB for a 151,936 x 1,536 one) beside the weights.
    """
    if weight.dtype == torch.float32:
        return q @ weight
    out = torch.zeros(q.shape[0], weight.shape[1], dtype=torch.float32, device=q.device)
    for start in range(0, weight.shape[0], vocab_block):
        out += q[:, start : start + vocab_block] @ weight[start : start + vocab_block].float()
    return out


def logsumexp_logits(normed: torch.Tensor, head: nn.Module, chunk_rows: int) -> torch.Tensor:
    """lse(W n + b) in float32 for normed (N, h) -> (N,), in tiles of rows x a slice of the vocabulary.

    A tile holds at most `LSE_TILE_ELEMENTS` logits on a CPU, `LOGIT_CHUNK_ELEMENTS` elsewhere. Row
    chunks over the whole vocabulary made that 110 rows of a 151,936-token head: a matmul far slower
    per row than one of 1,024 rows (one replay's metric on 1,024 positions, two cores: 6.7 s against 5.0 with tiles, the same memory;
    `docs/performance.md` §9), and every replay pays it. So a tile keeps many rows (`chunk_rows`,
    by default up to `LSE_TILE_ROWS`) against a slice of the vocabulary, and the slices' lse are
    combined by one more lse: exact up to float32 rounding.
    """
    weight, bias = _weight(head)
    rows = chunk_rows if chunk_rows > 0 else min(max(1, normed.shape[0]), LSE_TILE_ROWS)
    width = max(1, LSE_TILE_ELEMENTS.get(normed.device.type, LOGIT_CHUNK_ELEMENTS) // rows)  # vocabulary per tile
    out = torch.empty(normed.shape[0], dtype=torch.float32, device=normed.device)
    for first in range(0, normed.shape[0], rows):
        x = normed[first : first + rows]
        parts = [torch.logsumexp(F.linear(x, weight[v : v + width], None if bias is None else bias[v : v + width])
                                 .float(), dim=-1) for v in range(0, weight.shape[0], width)]
        out[first : first + rows] = parts[0] if len(parts) == 1 else torch.logsumexp(torch.stack(parts, -1), dim=-1)
    return out


@torch.no_grad()  # loaded weights require grad: in-place writes would otherwise keep every chunk's graph
def make_head_reference(norm: nn.Module, head: nn.Module, final_hidden: list[torch.Tensor], input_ids: list[torch.Tensor],
                        metric: str, device: torch.device, chunk_rows: int = 0) -> HeadReference:
    """The dense model's side of `metric` on every calibration batch (final hidden states (B, T, h))."""
    spec = METRICS.get(metric)
    weight, bias = _weight(head)
    reference = HeadReference(spec, [], [], [])
    for hidden, ids in zip(final_hidden, input_ids, strict=True):
        normed = norm(hidden.to(device, weight.dtype))[:, : hidden.shape[1] - spec.shift]  # (B, T', h)
        b, t, h = normed.shape
        flat = normed.reshape(b * t, h)
        next_ids = ids[:, 1 : 1 + t].reshape(-1).to(device) if ids.shape[1] > t else None
        const = torch.empty(b * t, dtype=torch.float32, device=device)
        pulled = torch.empty(b * t, h, dtype=torch.float32, device=device)
        bias_dot = torch.empty(b * t, dtype=torch.float32, device=device) if bias is not None else None
        for rows in _rows(flat, chunk_rows, weight.shape[0]):
            logits = F.linear(flat[rows], weight, bias).float()  # (rows, V)
            q, const[rows] = spec.target(logits, None if next_ids is None else next_ids[rows])
            one_hot = q.ndim == 1  # token ids
            pulled[rows] = weight[q].float() if one_hot else pull_back(q, weight)
            if bias_dot is not None and bias is not None:
                bias_dot[rows] = bias[q].float() if one_hot else q @ bias.float()
        reference.const.append(const.view(b, t))
        reference.pulled.append(pulled.view(b, t, h))
        reference.bias_dot.append(bias_dot.view(b, t) if bias_dot is not None else None)
    return reference


ROUGH_LOGITS_ELEMENTS = 1 << 28  # dense logits a rough head may hold (1 GiB in float32); more: the float32 head


def with_rough_head(reference: HeadReference, norm: nn.Module, head: nn.Module, final_hidden: list[torch.Tensor],
                    device: torch.device) -> HeadReference:
    """`reference` with a `RoughHead`, for replays whose layers run in bf16 (the auto profiler's screen).

    Only for a float32 head (a half-precision head's logits are rounded anyway) and while the dense
    logits fit `ROUGH_LOGITS_ELEMENTS`; otherwise `reference` as it is, and the head stays float32.
    It holds a bf16 copy of the head (467 MB for Qwen2.5-1.5B's) and the dense logits of the batches
    (78 MB for its one-window screen) while the replays that use it run.
    """
    weight, bias = _weight(head)
    shift = reference.metric.shift
    if weight.dtype != torch.float32 or reference.rough is not None:
        return reference
    if sum(h.shape[0] * (h.shape[1] - shift) for h in final_hidden) * weight.shape[0] > ROUGH_LOGITS_ELEMENTS:
        return reference
    logits, normed = [], []
    with torch.no_grad(), torch.autocast(device.type, enabled=False):
        for hidden in final_hidden:
            flat = norm(hidden.to(device, weight.dtype))[:, : hidden.shape[1] - shift].reshape(-1, weight.shape[1])
            normed.append(flat.float())
            logits.append(F.linear(flat, weight, bias).float())
        rough = RoughHead(logits, normed, weight.detach().to(torch.bfloat16))
    return replace(reference, rough=rough)


def rough_logsumexp(normed: torch.Tensor, rough: RoughHead, batch: int, copies: int) -> torch.Tensor:
    """lse(z_d + W (n − n_d)) in float32 for normed (copies*P, h) -> (copies*P,), the product in bf16.

    Tiled like `logsumexp_logits`: whole copies of the batch's positions (so z_d adds by broadcast) against
    slices of the vocabulary, the slices' lse combined by one more lse.
    """
    dense_logits, dense_normed = rough.logits[batch], rough.normed[batch]
    positions_, vocab = dense_logits.shape
    delta = (normed.float().reshape(copies, positions_, -1) - dense_normed).to(torch.bfloat16)
    per = max(1, LSE_TILE_ROWS // positions_)  # copies per tile
    elements = LSE_TILE_ELEMENTS.get(normed.device.type, LOGIT_CHUNK_ELEMENTS)
    width = max(1, elements // (min(per, copies) * positions_))
    out = torch.empty(copies, positions_, dtype=torch.float32, device=normed.device)
    for first in range(0, copies, per):
        x = delta[first : first + per]  # (k, P, h)
        parts = [torch.logsumexp(torch.add(dense_logits[:, v : v + width], F.linear(x, rough.weight[v : v + width])), dim=-1)
                 for v in range(0, vocab, width)]
        out[first : first + per] = parts[0] if len(parts) == 1 else torch.logsumexp(torch.stack(parts, -1), dim=-1)
    return out.reshape(-1)


def metric_sums(norm: nn.Module, head: nn.Module, hidden: torch.Tensor, batch: int, reference: HeadReference,
                copies: int, chunk_rows: int = 0) -> torch.Tensor:
    """Summed metric of each of `copies` stacked replays. hidden: (copies*B, T, h) -> (copies,) float64.

    Outside any autocast: a replay's layers may run in bf16, but logits rounded to bf16 (8 bits of
    mantissa on values near 20) move a position's logsumexp by a few hundredths, more than a small
    option's ΔL per position. With `reference.rough` the logsumexp's product is bf16 but of the
    difference from the dense state (`RoughHead`), for a replay that is an estimate anyway."""
    with torch.autocast(hidden.device.type, enabled=False):
        return _metric_sums(norm, head, hidden, batch, reference, copies, chunk_rows)


def _metric_sums(norm: nn.Module, head: nn.Module, hidden: torch.Tensor, batch: int, reference: HeadReference,
                 copies: int, chunk_rows: int) -> torch.Tensor:
    t_kept = hidden.shape[1] - reference.metric.shift
    # in the head's dtype, as the dense reference was: under bf16 autocast, float16 layers' residual
    # sums come out float32, which a float16 head refuses
    normed = norm(hidden.to(_weight(head)[0].dtype))[:, :t_kept]
    n, t, h = normed.shape
    flat = normed.reshape(n * t, h)
    lse = (logsumexp_logits(flat, head, chunk_rows) if reference.rough is None
           else rough_logsumexp(flat, reference.rough, batch, copies)).view(copies, n // copies, t)
    normed = normed.float().view(copies, n // copies, t, h)
    cross = (normed * reference.pulled[batch]).sum(-1) - lse  # q·z − lse(z), (copies, B, T')
    if reference.bias_dot[batch] is not None:
        cross = cross + reference.bias_dot[batch]
    return (reference.const[batch] - cross).double().sum(dim=(1, 2))


def dense_reference(adapter: ModelAdapter, inputs: LayerInputs, metric: str, device: torch.device,
                    chunk_rows: int = 0) -> HeadReference:
    """The dense model's side of `metric` on the calibration batches: every profiler's zero point."""
    return make_head_reference(adapter.final_norm(), adapter.lm_head(), inputs.final_hidden, inputs.input_ids, metric,
                               device, chunk_rows)
