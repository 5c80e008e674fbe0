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
(batched greedy, as SlimGPT), so a layer costs a few dozen rank-k updates of H⁻¹. For channels those
updates are deferred (`channel_order`): a step reads only the rows of H⁻¹ it removes, corrected by the
pending updates, and H⁻¹ is updated and compacted once every `FLUSH_EVERY` steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import torch

from gapprune.calibrate.gram import TokenGram, mirror_upper_, upper_blocks
from gapprune.importance.base import CRITERIA, ScoringContext

# a Gram matrix, its parts (borrowed), or a function that hands its parts over (see damped_inverse)
GramSource = torch.Tensor | Sequence[torch.Tensor] | Callable[[], list[torch.Tensor]]

DAMP = 0.01  # H + DAMP · mean(diag H) · I, as SparseGPT: keeps H⁻¹ finite for dead or collinear columns
CHANNEL_BLOCKS = 64  # MLP channels leave in this many greedy blocks
# channel steps whose H⁻¹ updates are applied together: an 8,960-wide MLP's pass in 6.8 s against 10.6
# updating at every step (`python benchmarks/profilers.py kernels`, performance.json `obs_layer`)
FLUSH_EVERY = 8
_TINY = float(torch.tensor(1e-12, dtype=torch.float32))  # keeps the positive-definite shift of earlier releases bit for bit


def removal_errors(weight: torch.Tensor, hinv: torch.Tensor, width: int) -> torch.Tensor:
    """E(u) = tr(W_u (H⁻¹_uu)⁻¹ W_uᵀ) of every unit u (`width` consecutive columns)."""
    n_units = weight.shape[1] // width
    if width == 1:  # MLP channels: the blocks are H⁻¹'s diagonal, so no batch of 1 × 1 inverses and
        # matmuls (a sixth of an 8,960-wide layer's OBS time); the same products and sum order, bit for bit
        w1 = weight.T.contiguous()  # (units, out)
        return (w1 * hinv.diagonal().reciprocal().unsqueeze(1)).mul_(w1).sum(1)
    blocks = hinv.view(n_units, width, n_units, width).diagonal(dim1=0, dim2=2).permute(2, 0, 1)  # (units, w, w)
    w = weight.view(weight.shape[0], n_units, width).transpose(0, 1)  # (units, out, w)
    return (torch.bmm(w, torch.linalg.inv(blocks)) * w).sum((1, 2))  # small blocks: invert, don't solve


def select_(matrix: torch.Tensor, rows: torch.Tensor, columns: torch.Tensor, rows_per_copy: int = 256) -> torch.Tensor:
    """matrix[rows][:, columns] written over the start of `matrix`'s own storage, returned as a view of it.

    `rows` and `columns` ascending. A copy of an 8,960-wide matrix is another 320 MB (float32) and, in
    a greedy OBS pass, the slowest step; this copies `rows_per_copy` selected rows at a time, front to
    back. Selected row j lands at [j·k, (j+1)·k), never past where a later selected row (index ≥ j+1,
    so starting at ≥ (j+1)·n) is still to be read, so nothing unread is overwritten."""
    assert matrix.is_contiguous() and matrix.dim() == 2
    k = len(columns)
    flat = matrix.view(-1)
    for start in range(0, len(rows), rows_per_copy):
        block = matrix.index_select(0, rows[start : start + rows_per_copy]).index_select(1, columns)
        flat[start * k : start * k + block.numel()] = block.flatten()
    return flat[: len(rows) * k].view(len(rows), k)


def compact_(matrix: torch.Tensor, keep: torch.Tensor, rows_per_copy: int = 256) -> torch.Tensor:
    """matrix[keep][:, keep] over `matrix`'s own storage (`select_`): H⁻¹ of the kept columns."""
    assert matrix.shape[0] == matrix.shape[1]
    kept = keep.nonzero().flatten()
    return select_(matrix, kept, kept, rows_per_copy)


def remove_columns(weight: torch.Tensor, hinv: torch.Tensor, columns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The OBS step for the columns S: the kept columns of W − W_S (H⁻¹_SS)⁻¹ H⁻¹_S,: and of
    H⁻¹ − H⁻¹_:,S (H⁻¹_SS)⁻¹ H⁻¹_S,: (which is H⁻¹ of the kept columns). Returned compacted: each
    later step works on the columns still there, so a layer costs a third of a full-size update.
    `hinv` is overwritten when contiguous (the result is then a view of its storage)."""
    keep = torch.ones(hinv.shape[0], dtype=torch.bool, device=hinv.device)
    keep[columns] = False
    block_inv = torch.linalg.inv(hinv[columns][:, columns])
    rows = hinv[columns][:, keep]  # (|S|, kept)
    weight = torch.addmm(weight[:, keep], weight[:, columns] @ block_inv, rows, alpha=-1)
    return weight, compact_(hinv.contiguous(), keep).addmm_(rows.T, block_inv @ rows, alpha=-1)


def damped_inverse(gram: GramSource, dtype: torch.dtype) -> torch.Tensor:
    """(H + DAMP·mean(diag H)·I)⁻¹ in `dtype` through a Cholesky factor; float64 if `dtype`'s fails.

    `gram` may come in parts (the calibration halves), summed here into the one n × n buffer this
    function factors and inverts in place: for an MLP the largest matrix of the run (321 MB at a
    width of 8,960), so no caller-held sum, eye()-sized temporary, or LAPACK copy of the factor or
    of the inverse (three more n² buffers before; the peak of a bf16 prune of a 1.5B model).
    Borrowed parts are copied once; parts handed over by a function (`GramStats.handover`) are
    summed into the first in place and each other one freed once added: no copy at all. The
    function is called again for the float64 retry. It runs where the Grams are (`solve_device`)."""
    if callable(gram):
        parts = gram()
        h = parts.pop(0)
        while parts:
            h.add_(parts.pop(0).to(h.device))  # the added half is freed here
    else:
        parts = [gram] if isinstance(gram, torch.Tensor) else list(gram)
        h = parts[0].clone()
        for part in parts[1:]:
            h.add_(part.to(h.device))
    h = h.to(dtype)
    h.diagonal().add_(DAMP * float(h.diagonal().mean())).add_(_TINY)  # = h + DAMP·mean·I + 1e-12·I, in place
    # LAPACK works on column-major storage; H is symmetric (XᵀX is, to the bit), so its transpose is
    # the same numbers in the order LAPACK wants, and potrf and potri run in h's own storage
    column_major = h.mT
    info = torch.empty((), dtype=torch.int32, device=h.device)
    chol, _ = torch.linalg.cholesky_ex(column_major, out=(column_major, info))
    if int(info) != 0:
        if dtype == torch.float64:
            raise torch.linalg.LinAlgError("the damped Gram matrix is not positive definite even in float64")
        del h, chol, column_major
        return damped_inverse(gram, torch.float64)
    inverse = torch.cholesky_inverse(chol, out=chol).mT  # row-major again: the compaction needs it
    return inverse if inverse.is_contiguous() else inverse.contiguous()


def obs_order(weight: torch.Tensor, gram: GramSource, width: int, per_step: int = 1,
              dtype: torch.dtype = torch.float32) -> list[int]:
    """Units (of `width` columns) in greedy OBS removal order, `per_step` of least error at a time.

    Solved in `dtype`: float32 by default (an MLP layer of Qwen2.5-1.5B takes a third of float64's
    time and half its memory); the damping keeps H's condition number bounded, and a unit's score
    is its greedy step, which rounding in the last digits rarely changes."""
    hinv = damped_inverse(gram, dtype)
    return channel_order(weight, hinv, per_step) if width == 1 else compacting_order(weight, hinv, width, per_step)


def compacting_order(weight: torch.Tensor, hinv: torch.Tensor, width: int, per_step: int) -> list[int]:
    """The greedy order with H⁻¹ (overwritten) updated and compacted at every step: for heads, whose
    H⁻¹ is small (an attention output's width), and as the plain form `channel_order` must agree with."""
    w = weight.detach().to(hinv.device, hinv.dtype)
    alive = torch.arange(w.shape[1] // width)  # original ids of the units still there, in column order
    order: list[int] = []
    while len(alive):
        take = removal_errors(w, hinv, width).argsort()[:per_step]
        columns = (take.view(-1, 1) * width + torch.arange(width, device=take.device)).flatten()
        w, hinv = remove_columns(w, hinv, columns)
        take = take.cpu()
        order += alive[take].tolist()
        kept = torch.ones(len(alive), dtype=torch.bool)
        kept[take] = False
        alive = alive[kept]
    return order


def inverse_root(block: torch.Tensor) -> torch.Tensor:
    """M with MᵀM = block⁻¹ for a symmetric positive definite block: L⁻¹ of its Cholesky factor L.

    Late in a float32 greedy pass the block of the few channels left can lose definiteness to
    rounding; its eigenvalues are then floored at a millionth of the largest, so the step stays finite."""
    chol, info = torch.linalg.cholesky_ex(block)
    if int(info) == 0:
        eye = torch.eye(block.shape[0], dtype=block.dtype, device=block.device)
        return torch.linalg.solve_triangular(chol, eye, upper=False)
    values, vectors = torch.linalg.eigh(block)
    floor = 1e-6 * float(values.abs().max())
    return (vectors * values.clamp(min=floor).rsqrt()).T


def channel_order(weight: torch.Tensor, hinv: torch.Tensor, per_step: int, flush_every: int = FLUSH_EVERY) -> list[int]:
    """`obs_order` for single columns given H⁻¹ (overwritten), its updates deferred: the same greedy order.

    Removing S turns H⁻¹ into H⁻¹ − VᵀV with V = M H⁻¹_S,: (MᵀM = (H⁻¹_SS)⁻¹, `inverse_root`), and W into
    W − (W_S Mᵀ) V. A step needs only the diagonal (kept up to date: minus the column norms of V) and
    the rows S, which it reads from the last updated H⁻¹ minus the pending V's. So H⁻¹ is written and
    compacted once per `flush_every` steps, in one update of rank `flush_every` · |S|: on an 8,960-wide
    MLP the eager loop's 64 compactions and rank-140 updates were most of a layer's OBS time. The update
    is symmetric, so only its upper blocks are computed (`calibrate/gram.py`, `upper_blocks`)."""
    device = hinv.device
    w = weight.detach().to(device, hinv.dtype).clone()  # (out, columns of hinv), removed ones kept until a flush
    ids = torch.arange(hinv.shape[0])  # original channel of each column of hinv
    alive = torch.ones(hinv.shape[0], dtype=torch.bool, device=device)
    diag = hinv.diagonal().clone()
    pending: list[torch.Tensor] = []  # the V of each step since the last flush, (|S|, columns)
    order: list[int] = []
    remaining = hinv.shape[0]
    while remaining:
        errors = w.square().sum(0).div_(diag).masked_fill_(~alive, float("inf"))  # E(u) = ||W_u||² / H⁻¹_uu
        take = errors.argsort()[: min(per_step, remaining)]
        columns = take.sort().values
        rows = hinv.index_select(0, columns)  # rows S of the last flushed H⁻¹ ...
        if pending:
            v_all = torch.cat(pending)
            rows.addmm_(v_all[:, columns].T, v_all, alpha=-1)  # ... minus the updates since
        whiten = inverse_root(rows[:, columns])
        v = whiten @ rows
        w.addmm_(w[:, columns] @ whiten.T, v, alpha=-1)
        diag.sub_(v.square().sum(0))
        order += ids[take.cpu()].tolist()
        alive[take] = False
        remaining -= len(take)
        pending.append(v)
        if remaining and len(pending) == flush_every:
            kept = alive.nonzero().flatten()
            v_all = torch.cat(pending)[:, kept]
            hinv = compact_(hinv, alive)
            for a, b in upper_blocks(len(kept)):  # H⁻¹ stays symmetric: update the upper blocks, mirror them
                hinv[a:b, a:].addmm_(v_all[:, a:b].T, v_all[:, a:], alpha=-1)
            mirror_upper_(hinv)
            w, diag, ids = w[:, kept], hinv.diagonal().clone(), ids[kept.cpu()]
            alive = torch.ones(len(kept), dtype=torch.bool, device=device)
            pending = []
    return order


def obs_order_tokens(weight: torch.Tensor, rows: torch.Tensor | Sequence[torch.Tensor], width: int, per_step: int = 1,
                     dtype: torch.dtype = torch.float32) -> list[int]:
    """`obs_order` for H = XᵀX given as its rows X (t, n) with t ≪ n (`TokenGram`), same order.

    With δ the damping, Woodbury gives H_KK⁻¹ = (I − X_Kᵀ M X_K)/δ with M = (δI + X_K X_Kᵀ)⁻¹, a
    t × t matrix: the removal errors need the w × w diagonal blocks of H_KK⁻¹ and the update the
    rows of the removed columns, so a step costs O(t²k) and memory stays t·n, never n².
    `rows` may come in parts (the calibration halves): they are joined into the one t × n buffer
    this function owns and shrinks in place, so a caller's joined copy is not held beside it (on a
    1.5B model's MLP each t × n buffer is 147 MB, and OBS scoring sets the peak of a bf16 prune)."""
    parts = [rows] if isinstance(rows, torch.Tensor) else list(rows)
    device = parts[0].device  # where the Grams are (`solve_device`)
    x = torch.cat([part.to(device, dtype) for part in parts])
    del parts, rows
    w = weight.detach().to(device, dtype)
    t, n = x.shape
    out = w.shape[0]
    delta = DAMP * float(x.double().square().sum()) / n + _TINY  # = DAMP·mean(diag XᵀX) + 1e-12, as obs_order
    eye_w = torch.eye(width, dtype=dtype, device=device)
    every_row = torch.arange(t, device=device)
    alive = torch.arange(n // width)
    info = torch.empty((), dtype=torch.int32, device=device)
    order: list[int] = []
    while len(alive):
        units = len(alive)
        gram = x @ x.T
        gram.diagonal().add_(delta)
        chol, _ = torch.linalg.cholesky_ex(gram, out=(gram, info))  # over its own storage
        if int(info) != 0:
            raise torch.linalg.LinAlgError("δI + X_K X_Kᵀ is not positive definite: the calibration rows hold NaN or inf")
        p = torch.cholesky_solve(x, chol)  # M X_K, (t, k)
        del chol, gram
        xu = x.view(t, units, width).permute(1, 2, 0)  # (units, w, t)
        pu = p.view(t, units, width).permute(1, 0, 2)  # (units, t, w)
        blocks = (eye_w - torch.bmm(xu, pu)) / delta  # diagonal blocks of H_KK⁻¹, (units, w, w)
        wu = w.view(out, units, width).transpose(0, 1)  # (units, out, w)
        errors = (torch.bmm(wu, torch.linalg.inv(blocks)) * wu).sum((1, 2))
        take = errors.argsort()[:per_step]
        columns = (take.view(-1, 1) * width + torch.arange(width, device=device)).flatten()
        take = take.cpu()
        order += alive[take].tolist()
        keep = torch.ones(units * width, dtype=torch.bool, device=device)
        keep[columns] = False
        hinv_rows = -(x[:, columns].T @ p)  # rows S of H_KK⁻¹ times δ: E_S − X_Sᵀ M X_K
        del xu, pu, p  # the next step's M X_K is not made beside this one
        hinv_rows[torch.arange(len(columns), device=device), columns] += 1
        hinv_rows /= delta
        block_inv = torch.linalg.inv(hinv_rows[:, columns])
        w = w[:, keep] - (w[:, columns] @ block_inv) @ hinv_rows[:, keep]
        x = select_(x, every_row, keep.nonzero().flatten())  # X_K over X's own storage
        kept = torch.ones(units, dtype=torch.bool)
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
    context.grams.ensure(layer, key)  # one layer's Grams at a time (calibrate/gram.py)
    width = context.adapter.unit_width(component)
    n_units = out.in_features // width
    per_step = 1 if component == "attn" else max(1, n_units // CHANNEL_BLOCKS)
    scores = torch.empty(n_units, dtype=torch.float64)
    fit, held_out = context.grams.fit[key], context.grams.held_out[key]
    if isinstance(fit, TokenGram) and isinstance(held_out, TokenGram):  # every calibration token's row
        order = obs_order_tokens(out.weight, [fit.rows, held_out.rows], width, per_step)
    else:
        del fit, held_out  # the halves are handed over and summed in place, not copied
        order = obs_order(out.weight, cast(GramSource, context.grams.handover(key)), width, per_step)  # n × n here
    scores[order] = torch.arange(n_units, dtype=torch.float64)
    return scores
