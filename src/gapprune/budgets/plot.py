"""Where the time and memory go, per layer: the plan against the dense model (needs matplotlib).

Beside `kept_fraction.png`: a parameter count says how much was cut, this says what it bought in
the runtime the costs were measured for (decode µs per token; weights and KV cache at a context).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gapprune.budgets.memory import kv_cells
from gapprune.budgets.table import RuntimeCosts
from gapprune.evaluate.plots import _pyplot


def layer_costs(costs: RuntimeCosts, choice: dict[str, list[int]], context: int) -> dict[str, np.ndarray]:
    """Per layer (n_layers,): decode µs of attention and MLP, weight MB of each, KV-cache MB at `context`."""
    cells = kv_cells(context)
    out = {}
    for kind, scale, name in (("decode_us", 1.0, "time"), ("weight_bytes", 1e-6, "weights")):
        rows = costs.per_layer(kind, choice)
        for c in ("attn", "mlp"):
            out[f"{name}_{c}"] = np.array([r[c] * scale for r in rows])
    out["kv"] = np.array([r["attn"] * cells * 1e-6 for r in costs.per_layer("kv_bytes_per_cell", choice)])
    return out


def plot_costs(costs: RuntimeCosts, choice: dict[str, list[int]], path: str | Path, context: int = 4096,
               title: str = "") -> None:
    """Two panels: decode time per layer (attention, MLP) and memory per layer (weights, KV cache),
    the plan's bars over the dense model's outline; fixed costs in the legend."""
    plt = _pyplot()
    plan, dense = layer_costs(costs, choice, context), layer_costs(costs, costs.dense_choice(), context)
    layers = np.arange(costs.dims.n_layers)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(6, len(layers) * 0.3), 6), sharex=True)
    timed = bool(costs.fit.get("timed", True))
    if timed:
        top.bar(layers, plan["time_attn"], color="tab:blue", label="attention")
        top.bar(layers, plan["time_mlp"], bottom=plan["time_attn"], color="tab:orange", label="MLP")
        top.step(layers, dense["time_attn"] + dense["time_mlp"], where="mid", color="k", lw=0.8, label="dense")
        top.set_ylabel("decode µs / token")
        top.set_title(f"{title} (fixed: {costs.fixed['decode_us']:.0f} µs/token; "
                      f"{costs.key.get('runtime')} {costs.key.get('file_type')}, {costs.key.get('threads')} thread)")
    else:
        top.text(0.5, 0.5, "times not measured for this type", ha="center", transform=top.transAxes)
    stack = np.zeros(len(layers))
    for key, color, label in (("weights_attn", "tab:blue", "attention weights"), ("weights_mlp", "tab:orange",
                              "MLP weights"), ("kv", "tab:green", f"KV cache at {context} tokens")):
        bottom.bar(layers, plan[key], bottom=stack, color=color, label=label)
        stack = stack + plan[key]
    dense_total = dense["weights_attn"] + dense["weights_mlp"] + dense["kv"]
    bottom.step(layers, dense_total, where="mid", color="k", lw=0.8, label="dense")
    bottom.set_ylabel("MB")
    bottom.set_xlabel(f"layer (fixed weights: {costs.fixed['weight_bytes'] / 1e6:.1f} MB)")
    for ax in (top, bottom):
        if ax.get_legend_handles_labels()[0]:  # the time panel is empty for a memory-only table
            ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
