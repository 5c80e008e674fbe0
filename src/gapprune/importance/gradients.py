"""Weight gradients of the calibration loss, for the taylor criterion."""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from gapprune.components import COMPONENTS
from gapprune.engine.capture import batches
from gapprune.models.adapter import ModelAdapter


def accumulate_gradients(
    adapter: ModelAdapter, input_ids: torch.Tensor, batch_size: int = 4, progress: bool = True
) -> dict[int, torch.Tensor]:
    """Σ over batches of ∂(mean next-token NLL)/∂W for every prunable Linear weight, keyed by id(weight)."""
    model = adapter.model
    device = next(model.parameters()).device
    weights = [lin.weight for l in range(adapter.n_layers) for c in COMPONENTS for lin in adapter.component_weights(l, c)]
    previous = {id(p): p.requires_grad for p in model.parameters()}
    for p in model.parameters():
        p.requires_grad_(False)
    for w in weights:
        w.requires_grad_(True)
        w.grad = None
    # half-precision weights: each batch's gradient is added into float32 sums, not into the weights' own
    # dtype, whose 8 (bf16) or 11 (fp16) mantissa bits round every addition; float32 weights accumulate
    # in their .grad as before (no second copy of every gradient)
    sums: dict[int, torch.Tensor] | None = None if weights[0].dtype == torch.float32 else {}
    try:
        for batch in tqdm(list(batches(input_ids, batch_size)), desc="gradients", disable=not progress):
            batch = batch.to(device)
            loss = model(input_ids=batch, labels=batch, use_cache=False).loss
            loss.backward()
            if sums is not None:
                for w in weights:
                    if w.grad is not None:
                        sums[id(w)] = sums[id(w)] + w.grad.float() if id(w) in sums else w.grad.float()
                        w.grad = None
        if unreached := sum(w.grad is None and (sums is None or id(w) not in sums) for w in weights):
            raise ValueError(f"{unreached} of the scored weights got no gradient: they do not reach the loss")
        if sums is not None:
            return sums
        return {id(w): w.grad.detach().clone() for w in weights if w.grad is not None}
    finally:
        for w in weights:
            w.grad = None
        for p in model.parameters():
            p.requires_grad_(previous[id(p)])
