"""Sequential compensation: each layer re-fitted on the inputs the already-pruned layers produce.

The default re-fits every output projection on the dense model's inputs, yet once the earlier
layers are pruned a layer never sees those inputs again. Here the layers are pruned in order
(SparseGPT, SlimGPT): the calibration windows run through the pruned and compensated layers
0..l−1, layer l's attention Gram is taken on that input, the attention is pruned and re-fitted,
the MLP Gram is taken with the new attention in place, the MLP is pruned and re-fitted, and the
layer's output feeds layer l+1. The fit target is the layer's own dense weights on the new input,
so with nothing removed nothing changes. Cost: one forward pass of the calibration set, plus the
two Gram passes, which stop at the projection whose input they take (the attention's pass skips
the MLP, most of a layer's work). A wide MLP's Grams are held as token rows (`LSQ_ROWS_FACTOR`).
"""

from __future__ import annotations

from typing import Any

import torch

from gapprune.calibrate.gram import GramStats, gram_observer, tokens_per_half
from gapprune.components import COMPONENTS
from gapprune.config import LSQ_ROWS_FACTOR
from gapprune.engine.capture import LayerInputs, replay_layer
from gapprune.engine.observe import observing
from gapprune.models.adapter import ModelAdapter
from gapprune.phases import layer_progress
from gapprune.pruning.compensate import add_summary, new_summary, prune_component_and_compensate_
from gapprune.pruning.plan import Plan
from gapprune.pruning.surgery import check_layers
from gapprune.refit import COMPENSATIONS, unit_columns


@torch.no_grad()
def prune_sequentially_(adapter: ModelAdapter, plan: Plan, inputs: LayerInputs, method: str = "lsq",
                        ridge: float = 1.0) -> dict[str, Any]:
    """Apply `plan` layer by layer, compensating each component on the pruned model's own inputs.

    inputs: the calibration pass's cached layer inputs (`Calibration.inputs`): layer 0's hidden
    states and every layer's keyword arguments (masks, positions) per batch.
    """
    if method not in COMPENSATIONS or method == "none":
        raise ValueError(f"sequential compensation re-fits with lsq or bias, got compensate={method!r}")
    check_layers(adapter, plan)
    hidden = list(inputs.hidden[0])
    tokens = tokens_per_half(hidden)
    summary = {**new_summary(method), "sequential": True}

    def input_gram(layer: int, component: str, out: torch.nn.Linear) -> GramStats:
        """The Grams of `out`'s input on the current hidden states; each batch stops at `out`."""
        stats = GramStats()
        with observing([(out, gram_observer(out, (layer, component), stats, tokens, LSQ_ROWS_FACTOR))]):
            replay_layer(adapter, layer, hidden, inputs.kwargs[layer], stop_at=out)
        stats.settle_()
        return stats

    # minutes on a billion-parameter model: show the layers go by (tiny models finish at once)
    layers = layer_progress(plan.layers, adapter.n_layers, adapter.layer_shape(0).intermediate, f"sequential {method}")
    for lp in layers:
        for c in COMPONENTS:
            out = adapter.out_proj(lp.layer, c)
            kept = lp.component(c).kept
            if out is None or len(unit_columns(adapter, c, kept)) == out.in_features:  # nothing to fit
                continue
            stats = input_gram(lp.layer, c, out)
            add_summary(summary, prune_component_and_compensate_(adapter, lp.layer, c, kept, stats, method, ridge))
        hidden = replay_layer(adapter, lp.layer, hidden, inputs.kwargs[lp.layer])
    adapter.record_shapes_()
    return summary
