"""The training-free re-fit of one output projection (DESIGN §6), as numbers: `lsq` or `bias` (FLAP).

Both work on the output projection of a component (o_proj / down_proj), whose input columns are
exactly the units. With X the dense input of that projection on calibration tokens:

* `lsq`: the kept columns W'_K and a bias b minimise ||W X − W'_K X_K − b||² + λ||W'_K − W_K||²
  (ridge towards the original weights), from G = XᵀX accumulated in float32 over batches, the
  input sums and the token count. It contains `bias` (λ → ∞) as a special case.
* `bias`: the removed channels' mean contribution W[:, R] E[x_R] is added as a bias.

Neither may make things worse: the reconstruction error of the result is checked on held-out
calibration batches (a second Gram matrix) and the original weights are kept when it rises.
Nothing here changes a model: pruning/compensate.py applies a refit after surgery, and the
compensation-aware loss table replays one (`compensated_projection`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gapprune.calibrate.gram import Gram, GramStats, TokenGram, quadratic
from gapprune.models.adapter import ModelAdapter

COMPENSATIONS = ("lsq", "bias", "none")


def reconstruction_error(dense: torch.Tensor, pruned: torch.Tensor, gram: Gram) -> float:
    """tr(D G Dᵀ) with D = dense − pruned (zero-padded to all columns): Σ over tokens of ||Δy||².
    Matrix products in float32 (no float64 copy of an intermediate² Gram), the sum in float64."""
    return float(quadratic(dense.float() - pruned.float(), gram))


def lsq_affine(weight: torch.Tensor, stats: GramStats, key: tuple[int, str], kept: torch.Tensor,
               ridge: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Kept columns and a bias: minimise Σ||W x − W'_K x_K − b||² + λ||W'_K − W_K||² over the fit half.

    The ridge pulls the kept columns towards their original values (not towards zero), so λ → ∞
    gives `bias` compensation and λ → 0 the unregularised re-fit; λ is `ridge` times the mean of
    diag(G[K, K]). The optimal bias is b = (W s − W'_K s_K)/n (s: input sums, n: tokens), and putting
    it back leaves the normal equations of the centred Gram C = G − s sᵀ/n:

        W'_K (C_KK + λI) = (W C)[:, K] + λ W_K

    solved in float32 through a Cholesky factor (C_KK + λI is positive definite): one |K|² system and
    its factor, where the augmented float64 system held five intermediate²-sized matrices.
    Returns (W'_K, b).
    """
    g, n = stats.fit[key], stats.counts[key][0]
    total = stats.sums[key][0].float()
    if isinstance(g, TokenGram):
        return lsq_affine_tokens(weight, g.rows, total, n, kept, ridge)
    w = weight.float()
    system = g.index_select(0, kept).index_select(1, kept)  # (k, k) float32, a fresh copy
    damp = ridge * float(system.diagonal().mean(dtype=torch.float64)) + 1e-8
    total_k = total[kept]
    system.addr_(total_k, total_k, alpha=-1.0 / max(n, 1)).diagonal().add_(damp)  # C_KK + λI, in place
    w_total = w @ total  # (out,)
    rhs = (w @ g)[:, kept]  # (W G)[:, K], as G is symmetric: (out, k)
    rhs.addr_(w_total, total_k, alpha=-1.0 / max(n, 1)).add_(w[:, kept], alpha=damp)
    chol, info = torch.linalg.cholesky_ex(system)
    del system
    if int(info) != 0:
        raise torch.linalg.LinAlgError(f"lsq system of {key} is not positive definite; raise --ridge")
    solved = torch.cholesky_solve(rhs.T, chol).T  # (out, k)
    shift = (w_total - solved @ total_k) / max(n, 1)
    return solved.to(weight.dtype), shift.to(weight.dtype)


def lsq_affine_tokens(weight: torch.Tensor, rows: torch.Tensor, total: torch.Tensor, n: int, kept: torch.Tensor,
                      ridge: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`lsq_affine` from the fit half's rows X (t, n), t ≪ n: the same solution through Woodbury.

    The centred rows X̃ = X − s/n give C = X̃ᵀX̃, so (C_KK + λI)⁻¹ = (I − X̃_Kᵀ(λI + X̃_K X̃_Kᵀ)⁻¹X̃_K)/λ:
    one t × t system instead of a |K| × |K| one. Every (out, k) step is done in the one result
    buffer (addmm_), so besides the weight it holds one weight-sized matrix, where the
    expression form had three to four alive at once (an 8B down_proj: 188 MB each)."""
    x = rows.float()
    centred = x - total / max(n, 1)  # (t, n)
    xk = centred[:, kept]  # (t, k)
    w = weight.float()
    damp = ridge * float(x[:, kept].double().square().sum()) / max(len(kept), 1) + 1e-8  # λ: as lsq_affine's
    solved = w[:, kept].mul_(damp).addmm_(w @ centred.T, xk)  # the right side (W C)[:, K] + λ W_K, (out, k)
    inner = xk @ xk.T
    inner.diagonal().add_(damp)
    chol, info = torch.linalg.cholesky_ex(inner)
    if int(info) != 0:
        raise torch.linalg.LinAlgError("lsq token-space system is not positive definite; raise --ridge")
    correction = torch.cholesky_solve((solved @ xk.T).T, chol).T  # (out, t)
    solved.addmm_(correction, xk, alpha=-1).div_(damp)
    shift = (w @ total - solved @ total[kept]) / max(n, 1)
    return solved.to(weight.dtype), shift.to(weight.dtype)


def affine_error(diff: torch.Tensor, bias: torch.Tensor, gram: Gram, total: torch.Tensor, n: int) -> float:
    """Σ over tokens of ||D x − b||² = tr(D G Dᵀ) − 2 bᵀ D s + n ||b||² (D: dense − pruned weights, zero-padded)."""
    b = bias.double()
    return float(quadratic(diff, gram) - 2 * (b @ (diff.double() @ total.double())) + n * (b @ b))


def removal_error(dense: torch.Tensor, kept: torch.Tensor, gram: Gram) -> float:
    """Σ over tokens of ||Δy||² when the columns not in `kept` are dropped without a refit. From rows,
    D Xᵀ is the dense weight times X with the kept columns zeroed: no weight-sized temporaries."""
    if isinstance(gram, TokenGram):
        masked = gram.rows.clone()
        masked[:, kept] = 0
        return float((dense.float() @ masked.T).square().sum(dtype=torch.float64))
    plain = torch.zeros_like(dense).index_copy_(1, kept, dense[:, kept])
    return reconstruction_error(dense, plain, gram)


def refit_error(dense: torch.Tensor, kept: torch.Tensor, weight: torch.Tensor, shift: torch.Tensor, gram: Gram,
                total: torch.Tensor, n: int) -> float:
    """Σ over tokens of ||dense x − weight x_K − shift||². From rows it is the (out, t) residual
    dense Xᵀ − weight X_Kᵀ − shift, without the padded weight-sized difference."""
    if isinstance(gram, TokenGram):
        rows = gram.rows
        residual = dense.float() @ rows.T - weight.float() @ rows[:, kept].T - shift.float().unsqueeze(1)
        return float(residual.square().sum(dtype=torch.float64))
    padded = torch.zeros_like(dense).index_copy_(1, kept, weight)
    return affine_error(dense - padded, shift, gram, total, n)


@dataclass
class Refit:
    """A compensated output projection: the kept columns, the bias to add, and the held-out errors
    (Σ||Δy||² of plain removal and of the refit); `better` says whether the refit is kept."""

    weight: torch.Tensor  # (out, |kept|)
    shift: torch.Tensor  # (out,)
    before: float
    after: float

    @property
    def better(self) -> bool:
        return self.after < self.before


def refit(dense: torch.Tensor, cols: list[int], stats: GramStats, key: tuple[int, str], method: str,
          ridge: float = 1.0) -> Refit:
    """The `lsq` or `bias` compensation of a projection that keeps the dense input columns `cols`."""
    stats.ensure(key[0])
    held_out = stats.held_out[key]
    dense = dense.detach().to(held_out.device)  # solves run where the Grams are (`solve_device`), in float32
    kept = torch.tensor(cols, dtype=torch.long, device=dense.device)
    before = removal_error(dense, kept, stats.held_out[key])
    if method == "lsq":
        weight, shift = lsq_affine(dense, stats, key, kept, ridge)
        after = refit_error(dense, kept, weight, shift, stats.held_out[key], stats.sums[key][1], stats.counts[key][1])
        return Refit(weight, shift, before, after)
    if method == "bias":  # the removed channels' mean contribution, fitted on one half, checked on the other
        removed = torch.tensor(sorted(set(range(dense.shape[1])) - set(cols)), dtype=torch.long, device=dense.device)
        w_removed = dense.double()[:, removed]  # (out, |R|)
        shift = w_removed @ stats.fit_mean(key)[removed]  # (out,)
        held_sum = w_removed @ stats.sums[key][1][removed]  # Σ over held-out tokens of W_R x_R
        after = before - 2 * float(shift @ held_sum) + stats.counts[key][1] * float(shift @ shift)
        return Refit(dense[:, kept], shift.to(dense.dtype), before, after)
    raise ValueError(f"unknown compensation {method!r}; choose from lsq, bias")


def unit_columns(adapter: ModelAdapter, component: str, kept_units: list[int]) -> list[int]:
    """The output projection's input columns of the kept units (a head owns `unit_width` consecutive ones)."""
    width = adapter.unit_width(component)
    return [u * width + d for u in kept_units for d in range(width)]


def compensated_projection(adapter: ModelAdapter, layer: int, component: str, kept_units: list[int], stats: GramStats,
                           method: str, ridge: float = 1.0) -> tuple[torch.Tensor, torch.Tensor] | None:
    """What the output projection of `component` becomes when only `kept_units` stay and it is then
    compensated as `compensate_` would: a full-width weight (zeros in removed columns) and the whole
    bias; None when nothing would be compensated (nothing or everything removed, or a refit that
    raises the held-out error). The model is not changed: the compensation-aware loss table replays it.
    """
    out = adapter.out_proj(layer, component)
    assert out is not None
    cols = unit_columns(adapter, component, kept_units)
    if method == "none" or not cols or len(cols) == out.in_features:
        return None
    dense = out.weight.data
    fit = refit(dense, cols, stats, (layer, component), method, ridge)
    if not fit.better:
        return None
    weight = torch.zeros_like(dense).index_copy_(1, torch.tensor(cols, device=dense.device),
                                                 fit.weight.to(dense.device, dense.dtype))
    bias = fit.shift.to(dense.device, dense.dtype) + (out.bias.data if out.bias is not None else 0)
    return weight, bias
