"""Training-free recovery after units are removed (DESIGN §6): `lsq` re-fit or `bias` (FLAP).

Both work on the output projection of a component (o_proj / down_proj), whose input columns are
exactly the units. With X the dense input of that projection on calibration tokens:

* `lsq`: the kept columns W'_K and a bias b minimise ||W X − W'_K X_K − b||² + λ||W'_K − W_K||²
  (ridge towards the original weights), from G = XᵀX accumulated in float32 over batches, the
  input sums and the token count. It contains `bias` (λ → ∞) as a special case.
* `bias`: the removed channels' mean contribution W[:, R] E[x_R] is added as a bias.

Neither may make things worse: the reconstruction error of the result is checked on held-out
calibration batches (a second Gram matrix) and the original weights are kept when it rises.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from gapprune.models.adapter import COMPONENTS, ModelAdapter
from gapprune.prune.plan import Plan, apply_plan_, check_layers, prune_layer_

log = logging.getLogger(__name__)
COMPENSATIONS = ("lsq", "bias", "none")


@dataclass
class GramStats:
    """Per (layer, component): Gram matrices of the output projection's input on two halves of the
    calibration batches (fit, held out), and the input mean for `bias`."""

    fit: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)  # (n_in, n_in) float32
    held_out: dict[tuple[int, str], torch.Tensor] = field(default_factory=dict)
    sums: dict[tuple[int, str], list[torch.Tensor]] = field(default_factory=dict)  # [fit, held out] (n_in,) float64
    counts: dict[tuple[int, str], list[int]] = field(default_factory=dict)  # [fit, held out] tokens
    batches: dict[tuple[int, str], int] = field(default_factory=dict)

    def fit_mean(self, key: tuple[int, str]) -> torch.Tensor:
        return self.sums[key][0] / max(self.counts[key][0], 1)


def gram_hooks(adapter: ModelAdapter, into: GramStats) -> Callable[[], list[torch.utils.hooks.RemovableHandle]]:
    """Hook installer for `capture_layer_inputs(extra_hooks=...)`: even batches fit, odd ones hold out."""

    def install() -> list[torch.utils.hooks.RemovableHandle]:
        handles = []
        for layer in range(adapter.n_layers):
            for component in COMPONENTS:
                out = adapter.out_proj(layer, component)
                if out is None:
                    continue
                key = (layer, component)
                n = out.in_features
                into.fit[key] = torch.zeros(n, n)
                into.held_out[key] = torch.zeros(n, n)
                into.sums[key] = [torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)]
                into.counts[key], into.batches[key] = [0, 0], 0

                def hook(module: nn.Module, args: tuple[Any, ...], key: tuple[int, str] = key) -> None:
                    x = args[0].detach().reshape(-1, args[0].shape[-1]).float().cpu()  # (tokens, n_in)
                    half = into.batches[key] % 2
                    (into.held_out if half else into.fit)[key] += x.T @ x
                    into.sums[key][half] += x.double().sum(0)
                    into.counts[key][half] += x.shape[0]
                    into.batches[key] += 1

                handles.append(out.register_forward_pre_hook(hook))
        return handles

    return install


def reconstruction_error(dense: torch.Tensor, pruned: torch.Tensor, gram: torch.Tensor) -> float:
    """tr(D G Dᵀ) with D = dense − pruned (zero-padded to all columns): Σ over tokens of ||Δy||²."""
    diff = dense.double() - pruned.double()  # (out, n_in)
    return float(((diff @ gram.double()) * diff).sum())


def lsq_affine(weight: torch.Tensor, stats: GramStats, key: tuple[int, str], kept: torch.Tensor,
               ridge: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Kept columns and a bias: minimise Σ||W x − W'_K x_K − b||² + λ||W'_K − W_K||² over the fit half.

    The ridge pulls the kept columns towards their original values (not towards zero), so λ → ∞
    gives `bias` compensation and λ → 0 the unregularised re-fit. Normal equations on the augmented
    input [x_K, 1]: the Gram block G[K, K], the input sums s_K and the token count n; λ is `ridge`
    times the mean of diag(G[K, K]). Returns (W'_K, b).
    """
    g, total, n = stats.fit[key].double(), stats.sums[key][0], stats.counts[key][0]
    k = len(kept)
    g_kk = g[kept][:, kept]
    damp = ridge * float(g_kk.diagonal().mean()) + 1e-8
    system = torch.zeros(k + 1, k + 1, dtype=torch.float64)
    system[:k, :k] = g_kk + damp * torch.eye(k, dtype=torch.float64)
    system[:k, k] = total[kept]
    system[k, :k] = total[kept]
    system[k, k] = n
    w = weight.double()
    rhs = torch.cat([w @ g[:, kept] + damp * w[:, kept], (w @ total).unsqueeze(1)], dim=1)  # (out, k + 1)
    solved = torch.linalg.solve(system, rhs.T).T
    return solved[:, :k].to(weight.dtype), solved[:, k].to(weight.dtype)


def affine_error(diff: torch.Tensor, bias: torch.Tensor, gram: torch.Tensor, total: torch.Tensor, n: int) -> float:
    """Σ over tokens of ||D x − b||² = tr(D G Dᵀ) − 2 bᵀ D s + n ||b||² (D: dense − pruned weights, zero-padded)."""
    d, b = diff.double(), bias.double()
    return float(((d @ gram.double()) * d).sum() - 2 * b @ (d @ total) + n * (b @ b))


def compensate_(
    adapter: ModelAdapter, dense_out: dict[tuple[int, str], torch.Tensor], kept_columns: dict[tuple[int, str], list[int]],
    stats: GramStats, method: str, ridge: float = 1.0,
) -> dict[str, Any]:
    """Re-fit every pruned component's output projection in place. Returns a summary per component.

    dense_out: the dense output-projection weights (out, n_in) before surgery;
    kept_columns: the dense column ids each pruned projection kept, in order.
    """
    if method not in COMPENSATIONS:
        raise ValueError(f"unknown compensation {method!r}; choose from {', '.join(COMPENSATIONS)}")
    summary: dict[str, Any] = {"method": method, "applied": 0, "kept_original": 0, "error_reduction": []}
    if method == "none":
        return summary
    for (layer, component), cols in kept_columns.items():
        out = adapter.out_proj(layer, component)
        dense = dense_out[(layer, component)]
        if out is None or len(cols) == dense.shape[1]:
            continue  # removed entirely (nothing to fit) or nothing removed
        key = (layer, component)
        kept = torch.tensor(cols)
        padded = lambda w: torch.zeros_like(dense).index_copy_(1, kept, w)
        before = reconstruction_error(dense, padded(out.weight.data), stats.held_out[key])
        if method == "lsq":
            new_weight, shift = lsq_affine(dense, stats, key, kept, ridge)
            after = affine_error(dense - padded(new_weight), shift, stats.held_out[key], stats.sums[key][1],
                                 stats.counts[key][1])
            if after < before:
                out.weight.data.copy_(new_weight)
                add_bias_(out, shift)
            else:
                log.info("layer %d %s: lsq would raise held-out error (%.4g -> %.4g); kept original", layer, component,
                         before, after)
        else:  # bias: the removed channels' mean contribution, fitted on one half, checked on the other
            removed = torch.tensor(sorted(set(range(dense.shape[1])) - set(cols)))
            w_removed = dense.double()[:, removed]  # (out, |R|)
            shift = w_removed @ stats.fit_mean(key)[removed]  # (out,)
            held_sum = w_removed @ stats.sums[key][1][removed]  # Σ over held-out tokens of W_R x_R
            after = before - 2 * float(shift @ held_sum) + stats.counts[key][1] * float(shift @ shift)
            if after < before:
                add_bias_(out, shift.to(dense.dtype))
        if after < before:
            summary["applied"] += 1
            summary["error_reduction"].append(round(1 - after / before, 4) if before else 0.0)
        else:
            summary["kept_original"] += 1
    return summary


def add_bias_(linear: nn.Linear, shift: torch.Tensor) -> None:
    """Add `shift` to the Linear's bias, creating the bias when the Linear has none."""
    if linear.bias is None:
        linear.bias = nn.Parameter(torch.zeros(linear.out_features, dtype=linear.weight.dtype, device=linear.weight.device))
    linear.bias.data.add_(shift.to(linear.bias.device))


def prune_and_compensate_(adapter: ModelAdapter, plan: Plan, method: str = "none", stats: GramStats | None = None,
                          ridge: float = 1.0) -> dict[str, Any]:
    """Apply `plan` physically, then re-fit the pruned output projections by `method`.

    Keeps the bookkeeping compensation needs: the dense output-projection weights from before the
    surgery and, per component, the dense input columns that survive it (a kept head owns
    `unit_width` consecutive columns).
    """
    if method not in COMPENSATIONS:
        raise ValueError(f"unknown compensation {method!r}; choose from {', '.join(COMPENSATIONS)}")
    if method == "none":
        apply_plan_(adapter, plan)
        return {"method": "none"}
    if stats is None:
        raise ValueError("compensation needs the Gram statistics of the calibration pass (gram_hooks)")
    check_layers(adapter, plan)
    summary: dict[str, Any] = {"method": method, "applied": 0, "kept_original": 0, "error_reduction": []}
    for lp in plan.layers:  # a layer at a time: only its dense output projections are copied (a streamed model)
        dense_out = {}
        for c in COMPONENTS:
            out = adapter.out_proj(lp.layer, c)
            if out is not None:
                dense_out[(lp.layer, c)] = out.weight.data.clone()
        kept: dict[tuple[int, str], list[int]] = {}
        for c in COMPONENTS:
            width = adapter.unit_width(c)
            kept[(lp.layer, c)] = [u * width + d for u in lp.component(c).kept for d in range(width)]
        prune_layer_(adapter, lp)
        part = compensate_(adapter, dense_out, kept, stats, method, ridge)
        summary["applied"] += part["applied"]
        summary["kept_original"] += part["kept_original"]
        summary["error_reduction"] += part["error_reduction"]
    adapter.record_shapes_()  # the new shapes, and the biases compensation may have added
    return summary
